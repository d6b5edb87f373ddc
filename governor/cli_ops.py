"""Operator commands on a live board (registered on governor.cli.app): `status`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from governor.cli import app


@app.command()
def status(
    name: Annotated[
        str | None, typer.Argument(help="policy name (default: every governed slice)")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="the stable JSON form (docs/status.schema.json)")
    ] = False,
) -> None:
    """What each governed slice enforces and uses: policy vs kernel per knob, usage, memory
    events, pressure, CPU, pids, rules and what they do next, the last actions. Exit 66 when
    NAME is not governed here."""
    from governor import api
    from governor.status import render

    items = api.status(name)
    if as_json:
        typer.echo(json.dumps(items, indent=2))
    else:
        typer.echo(render(items), nl=False)
