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


@app.command()
def top(
    delay: Annotated[
        float, typer.Option("--delay", "-d", help="seconds between refreshes", min=0.1)
    ] = 1.0,
    batch: Annotated[
        bool, typer.Option("--batch", "-b", help="print plain frames (for scripts), no screen")
    ] = False,
    iterations: Annotated[
        int | None, typer.Option("--iterations", "-n", help="stop after N frames", min=1)
    ] = None,
    sort: Annotated[
        str, typer.Option("--sort", help="memory, pressure or cpu (keys m, p, c)")
    ] = "memory",
) -> None:
    """A live view of every governed slice: memory vs high/max, anon/file, memory PSI, CPU and
    throttling, memory.events since the last frame, rule states. Keys: m p c sort, q quits."""
    import sys

    from governor.state import run_dir
    from governor.top import batch as run_batch
    from governor.top import interactive

    if sort not in ("memory", "pressure", "cpu"):
        raise typer.BadParameter("use memory, pressure or cpu", param_hint="--sort")
    if batch or not sys.stdout.isatty():
        run_batch(run_dir(), delay=delay, iterations=iterations, key=sort)
    else:
        interactive(run_dir(), delay=delay, iterations=iterations)
