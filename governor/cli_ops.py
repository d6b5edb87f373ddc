"""Operator commands on a live board (registered on governor.cli.app): `status`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from governor.cli import _opts, app


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


@app.command()
def diff(
    policy: Annotated[Path, typer.Argument(help="policy TOML file", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """The policy compiled on this host vs the kernel's files vs the installed systemd units
    (what `install` would render now), and the prerequisites (cgroup2, controllers, PSI).
    Exit 0 when everything is in sync, 1 on any drift (each mismatch listed with its values)."""
    from governor import api
    from governor.diff import render

    out = api.diff(policy, _opts())
    typer.echo(json.dumps(out, indent=2) if as_json else render(out), nl=as_json)
    raise typer.Exit(0 if out["in_sync"] else 1)
