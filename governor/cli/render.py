"""What the command line prints for each command's result: text for people, JSON on request.

governor/cli/app.py parses and calls governor.api; the exit codes stay there. These functions only
print. Imports beyond typer are lazy for the same reason as in cli.py (`governor launch` starts
fast)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from governor.bench.main import BenchResult
    from governor.compile.doctor import Finding
    from governor.deploy.install import Result
    from governor.engines.estimate import Estimate
    from governor.plan.host import HostFacts
    from governor.plan.model import Plan


def show_check(
    policy: Path, plan: Plan, est: Estimate | None = None, warnings: Sequence[str] = ()
) -> None:
    for w in warnings:
        typer.echo(f"  warning: {w}")
    if est is not None:
        from governor.engines.estimate import render

        typer.echo(render(est), nl=False)
    degraded = f", {len(plan.degraded)} limit(s) NOT in force" if plan.degraded else ""
    typer.echo(f"{policy}: ok ({len(plan.writes)} cgroup writes{degraded})")
    for d in plan.degraded:
        typer.echo(f"  NOT in force: {d}")


def show_plan(plan: Plan, *, as_json: bool) -> None:
    if as_json:
        typer.echo(plan.to_json())
    else:
        from governor.plan.render import plan_table

        typer.echo(plan_table(plan), nl=False)


def show_install(result: Result, verb: str, dry_run: bool) -> None:
    diff = result.diff()
    if diff:
        typer.echo(diff, nl=False)
    for kept in result.kept:
        typer.echo(f"kept (edited since install): {kept}", err=True)
    units = " ".join(result.units)
    what = f"{len(result.changes)} file(s) {'would change' if dry_run else 'changed'}"
    reloaded = result.reloaded
    typer.echo(f"{verb} {units}: {what}" + (f"; reloaded ({reloaded})" if reloaded else ""))


def show_install_json(result: Result, dry_run: bool) -> None:
    """`install/uninstall --json`: what the Ansible module (ansible_collections/governor/board)
    reads; ``changes`` holds each file's text before and after (null: absent)."""
    doc = {
        "units": list(result.units),
        "manifest": result.manifest,
        "dry_run": dry_run,
        "changed": bool(result.changes),
        "changes": [{"path": c.path, "before": c.old, "after": c.new} for c in result.changes],
        "kept": list(result.kept),
        "reloaded": result.reloaded,
    }
    typer.echo(json.dumps(doc, indent=2))


def _finding_dict(f: Finding) -> dict[str, object]:
    return {k: getattr(f, k) for k in ("level", "topic", "message", "fix")}


def show_doctor(host: HostFacts, findings: Sequence[Finding], *, as_json: bool) -> None:
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "host": host.to_dict(),
                    "findings": [_finding_dict(f) for f in findings],
                },
                indent=2,
            )
        )
    else:
        for f in findings:
            typer.echo(f"{f.level.upper():5} {f.topic:<16} {f.message}")
            if f.fix and f.level != "ok":
                typer.echo(f"{'':5} {'':<16} fix: {f.fix}")


def show_estimate(est: Estimate, *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(est.to_dict(), indent=2))
    else:
        from governor.engines.estimate import render

        typer.echo(render(est), nl=False)


def show_bench(result: BenchResult) -> None:
    for r in result.rows:
        peak = "?" if r.peak_bytes is None else f"{r.peak_bytes >> 20} MiB ({r.peak_source})"
        what = f"{r.model} -c {r.ctx}" if r.model is not None or r.ctx is not None else "engine"
        typer.echo(
            f"run {r.run}: {what}: exit {r.exit_status}, peak {peak},"
            f" prefill {r.prefill_tps} t/s, decode {r.decode_tps} t/s, {r.wall_s}s,"
            f" {r.outcome}, pressure rules fired {r.pressure_fired},"
            f" samples {r.samples} ({r.series_source or 'none'})"
        )
        if r.note:
            typer.echo(f"run {r.run}: {r.note}")
        if r.error:
            typer.echo(
                f"run {r.run} stderr (last lines):\n  " + r.error.replace("\n", "\n  "), err=True
            )
    for f in result.failures:
        typer.echo(f"GATE FAIL: {f}", err=True)
