"""Run-time commands: `launch` (the typer form of the lean path in governor/main.py),
`monitor`, `apply` and `remove`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from governor.cli.choices import BACKENDS
from governor.cli.complete import complete_policy_file
from governor.cli.options import (
    STATE,
    AllowMissing,
    Force,
    Metrics,
    PolicyArg,
    Psi,
    SampleInterval,
    finite,
    host_options,
    listen_option,
)


def launch(  # noqa: PLR0917  # typer passes every option as a parameter
    policy: Annotated[
        Path,
        typer.Option(
            "--policy", "-p", help="policy TOML file", autocompletion=complete_policy_file
        ),
    ],
    engine: Annotated[
        list[str],
        typer.Argument(help="the engine command after --, passed through byte for byte"),
    ],
    report: Annotated[
        Path | None, typer.Option("--report", help="write a JSON summary of the run here")
    ] = None,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="leave the slice (and any stragglers) after exit; status shows it and"
            " `governor remove` takes it away",
        ),
    ] = False,
    allow_missing: AllowMissing = "",
    sample_interval: SampleInterval = 1.0,
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            click_type=click.Choice(BACKENDS),
            help="cgroupfs: write <slice>/<name> directly; systemd: run in a delegated unit"
            " (the installed governor@ service, else a transient scope over D-Bus); auto:"
            " systemd when it is PID 1 and answers on the bus",
        ),
    ] = "cgroupfs",
    force: Force = False,
    psi: Psi = "trigger",
    metrics: Metrics = None,
) -> None:
    """Run an engine inside the policy's cgroup; exit with its status (128+N on signal N)."""
    from governor.api import launch as api_launch

    code = api_launch.launch(
        policy,
        tuple(engine),
        host_options(allow_missing),
        api_launch.LaunchOptions(
            report=report,
            keep=keep,
            sample_s=sample_interval,
            backend=backend,
            force=force,
            psi_triggers=psi == "trigger",
            metrics=listen_option(metrics),
            isolate_compile=True,  # as the lean path: a miss compiles in a short-lived child
            debug=STATE.debug,
        ),
    )
    raise typer.Exit(code)


def monitor(  # noqa: PLR0917  # typer passes every option as a parameter
    policy: PolicyArg,
    report: Annotated[
        Path | None, typer.Option("--report", help="write the monitor's JSON report here")
    ] = None,
    cgroup: Annotated[
        str | None,
        typer.Option(
            "--cgroup",
            help="watch this cgroup (relative to the cgroup2 root, e.g. a systemd unit's)"
            " instead of <slice>/<name>",
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option("--duration", help="stop after this many seconds", min=0.1, callback=finite),
    ] = None,
    allow_missing: AllowMissing = "",
    sample_interval: SampleInterval = 1.0,
    psi: Psi = "trigger",
    metrics: Metrics = None,
) -> None:
    """Act on [[pressure]] rules for an already-running slice until SIGINT/SIGTERM or it is gone.

    Publishes its state under /run/governor/NAME like launch (status, tune and metrics see it);
    exit 69 when NAME already has a live supervisor."""
    from governor.api import attach as api_attach

    out = api_attach.monitor(
        policy,
        host_options(allow_missing),
        api_attach.MonitorOptions(
            sample_s=sample_interval,
            report=report,
            cgroup=cgroup,
            duration_s=duration,
            psi_triggers=psi == "trigger",
            metrics=listen_option(metrics),
        ),
    )
    fired = sum(r["fired"] for r in out["rules"])
    typer.echo(f"{policy}: {fired} rule firing(s), {out['oom_kill_seen']} oom_kill seen")


def apply(policy: PolicyArg, allow_missing: AllowMissing = "") -> None:
    """Create the policy's slice with its limits, without starting anything."""
    from governor.api import apply as api_apply

    plan = api_apply.apply(policy, host_options(allow_missing))
    typer.echo(
        f"applied {plan.policy}: {plan.cgroup_root}/{plan.group} ({len(plan.writes)} writes)"
    )


def remove(policy: PolicyArg) -> None:
    """Kill whatever runs in the policy's cgroup and remove it."""
    from governor.api import apply as api_apply

    removed = api_apply.remove(policy, host_options())
    what = ", ".join(removed.removed) or "nothing (already gone)"
    typer.echo(f"removed {what}" + (" (killed its processes)" if removed.killed else ""))
