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

from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.record import record

if TYPE_CHECKING:
    from governor.api.host import HostOptions
    from governor.plan.model import Plan
    from governor.rundir.state import Publisher

# what the monitor's state carries over from `governor apply`'s
KEPT_FROM_APPLY = ("created", "backend", "systemd")


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
    from governor.errors import UsageError
    from governor.kernel.cgroupfs import CgroupFs

    try:
        if not cgroup:
            raise ValueError("empty")  # the root itself: never the engine's cgroup
        CgroupFs(Path("/")).path(cgroup)  # the kernel door's own rule for a cgroup path
    except ValueError:
        raise UsageError(
            f"--cgroup {cgroup[:80]!r} is not a cgroup below the cgroup2 root (command line)",
            hint="give it relative to the root, e.g. --cgroup system.slice/llama.service",
        ) from None


def _take_over(publisher: Publisher, plan: Plan) -> dict[str, Any] | None:
    """The state published before this monitor (`governor apply`'s, or a stale one), or
    HostError (69) when a live supervisor governs the name already."""
    import os

    from governor.errors import HostError
    from governor.rundir.state import alive

    prior = publisher.read()
    if prior is None or prior.get("source") == "apply":
        return prior
    pid = prior.get("pid")
    if isinstance(pid, int) and pid != os.getpid() and alive(pid):
        raise HostError(
            f"{plan.policy} is governed already by governor pid {pid}"
            f" ({prior.get('source')}, {publisher.path})",
            hint=f"its monitor acts on the slice: `governor status {plan.policy}` shows its"
            " rules; stop it first to attach another",
        )
    return None  # a stale state: replaced


def monitor(path: Path, opts: HostOptions, mopts: MonitorOptions) -> dict[str, Any]:
    """`governor monitor`: attach the pressure monitor to an already-running slice (one that
    `governor apply` or systemd created) until SIGINT/SIGTERM or the cgroup is gone."""
    import hashlib
    import os
    import signal
    import time

    from governor.api.host import check
    from governor.errors import HostError
    from governor.kernel.cgroupfs import CgroupFs
    from governor.kernel.procfs import ProcFs
    from governor.monitor.loop import Monitor
    from governor.rundir.journal import Journal
    from governor.rundir.state import Publisher, run_dir

    if mopts.cgroup is not None:
        _check_cgroup_option(mopts.cgroup)
    if mopts.report is not None:
        from governor.api.outputs import check_writable

        check_writable(mopts.report, "--report")
    plan = check(path, opts, attach=mopts.cgroup)
    fs = CgroupFs(Path(plan.cgroup_root))
    if not fs.exists(plan.group):
        raise HostError(
            f"nothing to monitor: {plan.cgroup_root}/{plan.group} does not exist (cgroup root)",
            hint="start it first (governor apply / launch, or its systemd unit), or pass --cgroup",
        )
    publisher = Publisher(run_dir(), plan.policy)
    prior = _take_over(publisher, plan)

    def engine_pids() -> list[int]:
        where = plan.leaf if fs.exists(plan.leaf) else plan.group
        return fs.procs(where)

    try:
        sha256: str | None = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        sha256 = None
    base: dict[str, Any] = {
        "policy": plan.policy,
        "source": "monitor",
        "policy_path": str(path.resolve()),
        "policy_sha256": sha256,
        "pid": os.getpid(),
        "started_at": round(time.time(), 3),
        "backend": "cgroupfs",
        "cgroup_root": plan.cgroup_root,
        "group": plan.group,
        "leaf": plan.leaf,
        "restarts": 0,
        "plan": plan.to_dict(),
    }
    if prior is not None:
        base.update({k: prior[k] for k in KEPT_FROM_APPLY if k in prior})
    # what status and the --metrics endpoint read; refreshed by the monitor's thread when a
    # rule changes state or fires (the scrape thread only reads the list's current item)
    snapshot: list[dict[str, Any]] = []

    def publish() -> None:
        try:
            engine: int | None = next(iter(engine_pids()), None)
        except OSError:
            engine = None
        state = base | {
            "engine_pid": engine,
            "rules": mon.rule_states(),
            "last_actions": list(mon.recent),
            "action_totals": mon.action_totals(),
        }
        snapshot[:] = [state]
        publisher.publish(state)

    endpoint = None
    if mopts.metrics is not None:
        from governor.api.launch import serve_metrics

        endpoint = serve_metrics(mopts.metrics, lambda: list(snapshot))
    # a freeze action holds the group while it runs: the sh watchdog thaws it if the monitor
    # dies (SIGKILL, OOM); every signal that ends it otherwise goes through finish() below
    from governor.supervise.watchdog import fork_watchdog

    watchdog = fork_watchdog()
    try:
        watchdog.arm_thaw(plan.cgroup_root, plan.group)
        stopped: list[int] = []
        previous = {
            sig: signal.signal(sig, lambda n, _f: stopped.append(n))
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
        }
        deadline = None if mopts.duration_s is None else time.monotonic() + mopts.duration_s
        # no restarts here: the executor answers `restart` with "needs governor launch"
        mon = Monitor(
            fs,
            plan,
            engine_pids=engine_pids,
            proc=ProcFs(opts.root / "proc"),
            sample_s=mopts.sample_s,
            psi_triggers=mopts.psi_triggers,
            on_change=publish,
            journal=Journal(run_dir() / plan.policy),  # set actions journaled; tunes kept
        ).start()
        publish()
        try:
            mon.run(
                lambda: bool(stopped) or (deadline is not None and time.monotonic() >= deadline)
            )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            out = mon.finish()
        if mopts.report is not None:
            import json

            mopts.report.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
        return out
    finally:
        watchdog.disarm()
        if endpoint is not None:
            endpoint.close()
        # apply's state again while its slice stands (status, remove's record); else none.
        # Only our own: a launch of the name may have started meanwhile and published its own
        if (publisher.read() or {}).get("pid") in (os.getpid(), None):
            if prior is not None and fs.exists(plan.group):
                publisher.publish({k: v for k, v in prior.items() if k != "format"})
            else:
                publisher.remove()
