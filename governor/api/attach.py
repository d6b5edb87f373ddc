"""`governor monitor`: the pressure monitor attached to a slice that already runs (made by
`governor apply`, by systemd, or any cgroup given with --cgroup).

Like a launch's supervisor it is a supervisor of its own: it publishes its state under
``/run/governor/<name>/`` (rules with their state, the last actions) for `governor status`,
`tune` and `metrics`, journals the limits its actions change, and keeps a tuned value as its
baseline. It refuses to attach where another live supervisor already governs the name (two
monitors acting on one slice fight). `governor apply`'s state is taken over while it runs (its
record of what apply created stays in it) and put back when it ends, if the slice is still
there."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from governor.api.host import HostOptions, check
from governor.api.launch import serve_metrics
from governor.api.outputs import check_writable
from governor.errors import UsageError
from governor.kernel.cgroupfs import CgroupFs
from governor.record import record
from governor.supervise.monitor import attach


@record(frozen=True)
class MonitorOptions:
    sample_s: float = 1.0
    report: Path | None = None
    cgroup: str | None = None  # watch this cgroup (relative to the root) instead of the plan's
    duration_s: float | None = None  # stop after this long (default: until signalled or gone)
    psi_triggers: bool = True  # False: evaluate PSI rules by polling total= (--psi poll)
    metrics: tuple[str, int] | None = None  # serve /metrics here while it runs (--metrics)


def _check_cgroup_option(cgroup: str) -> None:
    """``monitor --cgroup``: a path below the cgroup2 root, never out of it."""
    try:
        if not cgroup:
            raise ValueError("empty")  # the root itself: never the engine's cgroup
        CgroupFs(Path("/")).path(cgroup)  # the kernel door's own rule for a cgroup path
    except ValueError:
        raise UsageError(
            f"--cgroup {cgroup[:80]!r} is not a cgroup below the cgroup2 root (--cgroup)",
            hint="give it relative to the root, e.g. --cgroup system.slice/llama.service",
        ) from None


def monitor(path: Path, opts: HostOptions, mopts: MonitorOptions) -> dict[str, Any]:
    """`governor monitor`: attach the pressure monitor to an already-running slice (one that
    `governor apply` or systemd created) until SIGINT/SIGTERM or the cgroup is gone; the run
    itself is governor/supervise/monitor.py."""
    if mopts.cgroup is not None:
        _check_cgroup_option(mopts.cgroup)
    if mopts.report is not None:
        check_writable(mopts.report, "--report")
    plan = check(path, opts, attach=mopts.cgroup)
    serve = None
    if mopts.metrics is not None:
        serve = partial(serve_metrics, mopts.metrics)
    return attach(
        plan,
        policy_path=path,
        proc_root=opts.root / "proc",
        sample_s=mopts.sample_s,
        psi_triggers=mopts.psi_triggers,
        duration_s=mopts.duration_s,
        report=mopts.report,
        serve=serve,
    )
