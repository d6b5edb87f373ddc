"""Operator commands on a live board: `status`, `top`, `diff`, `tune`, `rollback` and
`metrics` (the Prometheus exposition of the governed slices, once)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import click
import typer
from typer.core import TyperCommand

from governor.cli.options import (
    NAME_COMPLETION,
    STATE,
    AllowMissing,
    PolicyArg,
    exclusive,
    host_options,
)


def status(
    name: Annotated[
        str | None,
        typer.Argument(help="policy name (default: every governed slice)", **NAME_COMPLETION),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="the stable JSON form (docs/status.schema.json)")
    ] = False,
    prune: Annotated[
        bool,
        typer.Option(
            "--prune",
            help="first remove the published state of stale entries (their supervisor is"
            " gone; an apply slice's cgroup is gone), then show what is left",
        ),
    ] = False,
) -> None:
    """What each governed slice enforces and uses: policy vs kernel per knob, usage, memory
    events, pressure, CPU, pids, device memory (DRM/dma-buf) and the board's CMA and
    unaccounted memory, rules and what they do next, the last actions. Exit 66 when NAME is
    not governed here (with --prune: when it had nothing to prune either)."""
    from governor.cli.statuscmd import status as run_status  # the lean path's (main.py)

    run_status(debug=STATE.debug, root=str(host_options().root), name=name, as_json=as_json,
               prune=prune)  # fmt: skip


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
    """A live view of every governed slice: memory vs high/max, anon/file, device memory, memory PSI, CPU and
    throttling, memory.events since the last frame, rule states. Keys: m p c sort, q quits."""

    from governor.operate.top import batch as run_batch
    from governor.operate.top import interactive
    from governor.rundir.state import run_dir

    if sort not in ("memory", "pressure", "cpu"):
        raise typer.BadParameter("use memory, pressure or cpu", param_hint="--sort")
    if batch or not sys.stdout.isatty():
        run_batch(run_dir(), delay=delay, iterations=iterations, key=sort)
    else:
        interactive(run_dir(), delay=delay, iterations=iterations)


def diff(
    policy: PolicyArg,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    allow_missing: AllowMissing = "",
) -> None:
    """The policy compiled on this host vs the kernel's files vs the installed systemd units
    (what `install` would render now), and the prerequisites (cgroup2, controllers, PSI).
    Exit 0 when everything is in sync, 1 on any drift (each mismatch listed with its values).
    What --allow-missing names, here or for the launch that runs the policy, is listed as
    skipped, not as drift."""
    from governor.api import diff as api_diff
    from governor.operate.diff import render

    out = api_diff.diff(policy, host_options(allow_missing))
    typer.echo(json.dumps(out, indent=2) if as_json else render(out), nl=as_json)
    raise typer.Exit(0 if out["in_sync"] else 1)


class TuneCommand(TyperCommand):
    """`--confirm` takes an optional value: bare (last, or before another option or a
    KEY=VALUE) it means "confirm now" (typer 0.21 passes no flag_value to click)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        out = list(args)
        for i, arg in enumerate(out):
            if arg == "--":
                break
            if arg == "--confirm":
                following = out[i + 1] if i + 1 < len(out) else None
                if following is None or following.startswith("-") or "=" in following:
                    out.insert(i + 1, "now")
                break
        return super().parse_args(ctx, out)


def tune(  # noqa: PLR0917  # typer passes every option as a parameter
    name: Annotated[str, typer.Argument(help="policy name of a governed slice", **NAME_COMPLETION)],
    assignments: Annotated[
        list[str] | None,
        typer.Argument(
            help="KEY=VALUE in the policy's spelling: memory.min/low/high/max/swap_max,"
            " cpu.weight/max/cpus, pids.max, io.weight (e.g. memory.high=1.5GiB)",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print kernel -> new for each file; change nothing")
    ] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="lower memory.max below usage + margin or memory.min anyway"),
    ] = False,
    persist: Annotated[
        bool,
        typer.Option(
            "--persist",
            help="also keep the values: in the policy file (comments kept), or for an installed"
            " policy in a drop-in of its slice unit; the diff is shown",
        ),
    ] = False,
    confirm: Annotated[
        str | None,
        typer.Option(
            "--confirm",
            metavar="[DURATION]",
            help="with KEY=VALUE: revert by itself after DURATION (90s, 5m, 1h) unless"
            " confirmed; alone (`governor tune NAME --confirm`): keep the pending change",
        ),
    ] = None,
) -> None:
    """Change a running slice's limits: validated like the policy, guarded against the live
    usage (65), memory.max lowered in stages, reverted if it causes an OOM kill (71), journaled
    for `governor rollback`. Under systemd, slice-level knobs go through the manager (runtime
    unit properties), so `systemctl show` agrees."""

    from governor.api import tune as api_tune

    out = api_tune.tune(
        name, tuple(assignments or ()), dry_run=dry_run, force=force, persist=persist,
        confirm=confirm,
    )  # fmt: skip
    if "confirmed" in out:
        ids = out["confirmed"]
        typer.echo(
            f"{name}: confirmed journal entr{'ies' if len(ids) > 1 else 'y'} {ids}"
            if ids
            else f"{name}: no change is waiting for a confirmation"
        )
        return
    saved = out.get("persisted")
    if saved is not None:
        typer.echo(saved["diff"] or f"{saved['file']}: already says so", nl=False)
        if saved["installed"] and not saved.get("dropin"):
            typer.echo(f"hint: run `governor install {saved['file']}` to render it into the units")
    if not out["changes"]:
        typer.echo(f"{name}: nothing to change (the kernel already holds these values)")
        return
    verb = "would change" if out["dry_run"] else f"changed (journal entry {out['id']})"
    typer.echo(f"{name}: {verb}")
    for ch in out["changes"]:
        before = ch.get("kernel", ch.get("before"))
        after = ch.get("new", ch.get("after"))
        via = f"  (via {ch['unit']})" if ch.get("unit") else ""
        typer.echo(f"  {ch['file']}: {before} -> {after}{via}")
    if out.get("confirm_by"):
        at = time.strftime("%H:%M:%S", time.localtime(out["confirm_by"]))
        typer.echo(f"reverts at {at} unless confirmed: governor tune {name} --confirm")


def rollback(
    name: Annotated[str, typer.Argument(help="policy name of a governed slice", **NAME_COMPLETION)],
    to: Annotated[
        int | None, typer.Option("--to", help="undo every change after journal entry ID", min=0)
    ] = None,
    everything: Annotated[
        bool, typer.Option("--all", help="undo every change in the journal (tunes and monitor)")
    ] = False,
) -> None:
    """Undo changes from the slice's journal in reverse order: the last tune by default.
    --to and --all are mutually exclusive (exit 2)."""
    from governor.api import operate as api_operate

    exclusive("--to", to is not None, "--all", everything, "give one: --to ID or --all")
    out = api_operate.rollback(name, to=to, everything=everything)
    typer.echo(f"{name}: rolled back entries {out['undoes']} (journal entry {out['id']})")
    for ch in out["changes"]:
        typer.echo(f"  {ch['file']}: {ch['before']} -> {ch['after']}")


def metrics(
    name: Annotated[
        str | None,
        typer.Argument(help="policy name (default: every governed slice)", **NAME_COMPLETION),
    ] = None,
    textfile: Annotated[
        Path | None,
        typer.Option(
            "--textfile",
            help="write DIR/governor.prom atomically for node_exporter's textfile collector"
            " (--collector.textfile.directory DIR) instead of printing",
        ),
    ] = None,
) -> None:
    """The governed slices' Prometheus metrics (the names `launch --metrics` serves), once:
    printed, or written for node_exporter (run it from a timer). Exit 66 when NAME is not
    governed here or DIR does not exist."""
    from governor.api import operate as api_operate

    out = api_operate.metrics(textfile, name)
    if isinstance(out, bytes):
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    else:
        typer.echo(f"wrote {out}")


def board(
    engine: Annotated[
        list[str] | None,
        typer.Argument(help="with --fits: the engine command after --, for its estimate"),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="the JSON form (format 1: fields are only added)")
    ] = False,
    fits: Annotated[
        Path | None,
        typer.Option(
            "--fits",
            metavar="POLICY",
            help="would POLICY fit beside the board's claims now (its engine's estimate after"
            ' --): yes (exit 0) or no (exit 75), and the victims admit = "shed" would stop',
        ),
    ] = None,
) -> None:
    """The whole board's memory: MemTotal, reserve and budget; each governed slice's class,
    memory.min, peak claim, memory.current and state (running or installed); the big
    ungoverned cgroups; what is left for guarantees and for peaks (docs/several.md)."""
    from governor.api import board as api_board

    opts = host_options()
    if fits is None:
        if engine:
            raise typer.BadParameter("an engine command needs --fits POLICY", param_hint="ENGINE")
        v = api_board.view(opts)
        if as_json:
            typer.echo(json.dumps(v, indent=2))
        else:
            from governor.operate.boardview import render

            typer.echo(render(v), nl=False)
        return
    out = api_board.fits(fits, tuple(engine or ()), opts)
    typer.echo(json.dumps(out, indent=2) if as_json else out["line"])
    if not out["fits"]:
        raise typer.Exit(75)  # EX_TEMPFAIL, as a refused launch: the board cannot take it now
