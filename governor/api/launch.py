"""`governor launch` in the composition root: the compiled plan (cached, else compiled with
every refusal launch makes before it applies anything: api/launch_compile.py), the child's
setup (governor/launch/), then the supervisor (governor/supervise/supervisor.py).

This module is the lean path's (governor/main.py): what it imports at module level is what a
cached launch runs anyway. The imports left inside functions are deliberate, each for one
branch a plain cached cgroupfs launch does not take; each says which."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.api.admit import Admitted, admission
from governor.api.host import (
    HostOptions,
    cgroupfs_backend,
    check_device,
    sysfs_root,
)
from governor.cache import plans as compiled
from governor.errors import UsageError
from governor.kernel.parse import cpuinfo_machine
from governor.kernel.procfs import ProcFs
from governor.launch.child import child_setup
from governor.launch.executable import resolve_executable
from governor.launch.launcher import Launcher
from governor.log import get_logger
from governor.monitor.actions import registry as verbs
from governor.peer.router import base_url
from governor.plan.host import HostFacts
from governor.plan.llama_args import server_address, slot_save_path
from governor.plan.model import Plan
from governor.plan.render import enforcement
from governor.record import record, replace
from governor.rundir.state import run_dir
from governor.state.peaks import learned, peak_key
from governor.state.store import state_dir
from governor.supervise.ready import server_url
from governor.supervise.supervisor import Backend, Job, Supervisor
from governor.supervise.watchdog import Watchdog, fork_watchdog

if TYPE_CHECKING:
    from governor.metrics.export import Endpoint
    from governor.rundir.state import RunState

log = get_logger("governor.launch")


@record(frozen=True)
class LaunchOptions:
    report: Path | None = None
    keep: bool = False
    sample_s: float = 1.0  # the monitor's sampler interval (memory.current/peak/stat)
    backend: str = "cgroupfs"  # cgroupfs | systemd | auto (governor/backends/systemd.py)
    force: bool = False  # launch even when the GGUF estimate exceeds memory.max
    psi_triggers: bool = True  # False: evaluate PSI rules by polling total= (--psi poll)
    watchdog: Watchdog | None = None  # forked early by governor.main; else forked here
    plan_cache: bool = True  # look up / store the compiled plan (governor/cache/plans.py)
    # compile a miss in a short-lived child (governor/api/isolate.py): the lean path's
    # supervisor never holds the compile-time stack; debug: the child's error printer's
    isolate_compile: bool = False
    debug: bool = False
    metrics: tuple[str, int] | None = None  # serve /metrics here while it runs (--metrics)


def _backend_name(opts: HostOptions, lopts: LaunchOptions) -> str:
    """Resolve --backend auto before probing (the systemd layout probes no slice path)."""
    if lopts.backend == "cgroupfs":
        return "cgroupfs"
    # lazy: --backend auto/systemd only (it may ask the bus)
    from governor.backends.choose import choose

    pid1 = ProcFs(opts.root / "proc").pid1_comm()  # "" under hidepid=: not systemd
    return choose(lopts.backend, pid1=pid1)  # type: ignore[arg-type]  # cli validates it


def _launch_backend(
    entry: compiled.Compiled, name: str, host: HostFacts, opts: HostOptions
) -> tuple[Plan, Backend]:
    """(plan, backend) for launch: the cgroupfs layout, or the compiled placement inside a
    systemd unit (the installed service or a transient scope, whichever this process is in)."""
    if name != "systemd":
        return entry.plan, cgroupfs_backend(entry.plan)
    # lazy: --backend systemd only (the unit's placement and the manager's bus)
    from governor.backends.systemd import for_launch
    from governor.plan.placement import CompiledPlacement

    placements = tuple(CompiledPlacement(m, u, c, p) for m, u, c, p in entry.placements)  # type: ignore[arg-type]  # modes written by compile_placements
    return for_launch(
        entry.plan,
        systemd_version=host.systemd_version,
        proc_root=opts.root / "proc",
        placements=placements,
    )


def _systemd_state(full: Plan, backend: Backend, host: HostFacts) -> dict[str, Any] | None:
    """For the published state under systemd: the unit carrying the limits and their values."""
    placement = getattr(backend, "placement", None)
    if placement is None or host.systemd_version is None:
        return None
    from governor.backends.manager import describe  # lazy: under systemd only

    return describe(full, placement.cgroup, host.systemd_version)


def _announce(plan: Plan, leaf: str | None = None) -> None:
    """Say plainly, on stderr, where the engine runs and which limits are (not) in force."""
    on, off = enforcement(plan)
    out = sys.stderr
    out.write(f"governor: {plan.policy} -> {plan.cgroup_root}/{leaf or plan.leaf}\n")
    out.write(f"governor: enforced: {', '.join(on)}\n")
    for line in off:
        out.write(f"governor: NOT enforced: {line}\n")
    out.flush()


def _check_report(lopts: LaunchOptions) -> None:
    if lopts.report is not None:
        from governor.api.outputs import check_writable  # lazy: --report only

        check_writable(lopts.report, "--report")


def launch(path: Path, argv: tuple[str, ...], opts: HostOptions, lopts: LaunchOptions) -> int:
    """`governor launch`: the compiled plan (cached, else compiled with every pre-apply
    refusal), then the supervisor. Returns the engine's status (128+N for signal N)."""
    if not argv:
        raise UsageError(
            "no engine command given (-- ENGINE)",
            hint="governor launch --policy P -- ENGINE ARGS...",
        )
    executable = resolve_executable(argv[0], os.environ.get("PATH"))
    directory = run_dir()  # no run directory (69) refuses before anything is applied
    _check_report(lopts)
    backend_name = _backend_name(opts, lopts)
    entry, host = compiled_for_launch(path, argv, opts, lopts, backend_name)
    for event, message in entry.warnings:
        log.warning(event, message=message)
    check_device(entry.plan, opts)  # live, also on a cached plan: MemAvailable moves
    extra = learned_extra(entry.estimate, argv, state_dir())  # the peaks earlier runs measured
    # the plan is compiled and checked; nothing is applied before the supervisor runs the job
    admitted = admit_launch(entry, directory, opts, lopts, extra)  # 75 before applying
    try:
        plan, backend = _launch_backend(entry, backend_name, host, opts)
    except BaseException:
        admitted.release()
        raise
    # --metrics binds first: a busy port is the one error line, before anything is applied
    supervisors: list[Supervisor] = []
    endpoint = None
    if lopts.metrics is not None:
        endpoint = serve_metrics(
            lopts.metrics, lambda: [s.state for s in supervisors if s.state is not None]
        )
    try:
        _announce(entry.plan, leaf=plan.leaf)
        job = _job(
            entry,
            plan,
            backend=backend,
            host=host,
            command=(executable, argv),
            directory=directory,
            opts=opts,
            lopts=lopts,
            backend_name=backend_name,
            admitted=admitted,
            extra=extra,
        )
        supervisor = _supervisor(plan, backend, opts, lopts)
        supervisors.append(supervisor)
        return supervisor.run(job)
    finally:
        if endpoint is not None:
            endpoint.close()


def _job(
    entry: compiled.Compiled,
    plan: Plan,
    *,
    backend: Backend,
    host: HostFacts,
    command: tuple[str, tuple[str, ...]],
    directory: Path,
    opts: HostOptions,
    lopts: LaunchOptions,
    backend_name: str,
    admitted: Admitted,
    extra: dict[str, Any],
) -> Job:
    """The launch, resolved for the supervisor: the plan to apply, the child to start
    (``command``: the resolved executable and the engine's argv)."""
    executable, argv = command
    return Job(
        plan=plan,
        setup=child_setup(plan, executable, argv),
        prefetch_files=entry.prefetch_files,
        report=lopts.report,
        keep=lopts.keep,
        sample_s=lopts.sample_s,
        psi_triggers=lopts.psi_triggers,
        extra=extra,
        backend=backend_name,
        policy_sha256=entry.chain[0][1] if entry.chain else None,
        model_bytes=entry.model_bytes,
        systemd=_systemd_state(entry.plan, backend, host),
        ready_url=ready_url(entry, argv, engine_env(plan)),
        ready_timeout_s=plan.engine.ready_timeout_s,
        sysfs_root=str(sysfs_root(opts)),
        run_dir=directory,
        board_release=admitted.release,
        admit_note=admitted.note,
        model_leaves=model_leaves(plan, entry.estimate),
        router_url=router_url(entry.estimate, argv, engine_env(plan)),
        slot_save=slot_save_path(argv, engine_env(plan)) is not None,
        board_root=opts.root,
    )


def _supervisor(
    plan: Plan, backend: Backend, opts: HostOptions, lopts: LaunchOptions
) -> Supervisor:
    proc = ProcFs(opts.root / "proc")
    watchdog = lopts.watchdog
    if watchdog is None and needs_watchdog(plan):
        watchdog = fork_watchdog()
    return Supervisor(backend, Launcher(backend.fs, proc=proc), proc=proc, watchdog=watchdog)


def admit_launch(
    entry: compiled.Compiled,
    directory: Path,
    opts: HostOptions,
    lopts: LaunchOptions,
    extra: dict[str, Any] | None = None,
) -> Admitted:
    """The board's admission (governor/api/admit.py): the board lock, held until the state is
    published, or AdmissionRefused (75); the claim is the peak earlier runs measured when
    ``extra`` (:func:`learned_extra`) has one, else the estimate."""
    total = (entry.estimate or {}).get("total")
    est = (extra or {}).get("estimate") or {}
    measured = est.get("measured"), est.get("measured_runs")
    return admission(
        entry.plan,
        run=directory,
        root=opts.root,
        estimate=total if isinstance(total, int) else None,
        force=lopts.force,
        measured=measured if all(isinstance(v, int) for v in measured) else None,  # type: ignore[arg-type]  # checked
    )


def learned_extra(
    estimate: dict[str, Any] | None, argv: tuple[str, ...], directory: Path
) -> dict[str, Any]:
    """The job's extra: the estimate, with the peak earlier runs of this model and argv measured
    (governor/state/peaks.py: ``measured``, ``measured_runs``), and the key the supervisor
    records this run's peak under (``peak_key``). A bad store is one warning."""
    if estimate is None:
        return {}
    model = estimate.get("model")
    if not isinstance(model, str) or "router" in estimate:
        return {"estimate": estimate}
    key = peak_key(model, argv)
    got, note = learned(directory, key)
    if note is not None:
        log.warning("peaks.unreadable", message=note)
    if got is not None:
        estimate = {**estimate, "measured": got.peak, "measured_runs": got.runs}
        log.info(
            "peak.measured",
            message=f"{got.text()} beside the estimate's {estimate.get('total')} bytes",
        )
    return {"estimate": estimate, **({"peak_key": key} if key is not None else {})}


def model_leaves(plan: Plan, estimate: dict[str, Any] | None) -> dict[str, Any] | None:
    """llama-server's router: each model's leaf limits (governor/supervise/models.py), its
    [engine.models.<alias>] table, else its estimate + headroom (compiled with the estimate,
    api/host.py) as max; None when the engine is no router."""
    if estimate is None or "router" not in estimate:
        return None
    tables = {m.alias: m for m in plan.engine.models}
    out: dict[str, Any] = {}
    for alias, default in estimate.get("router_max", {}).items():
        out[alias] = {"max": default}
    for alias, spec in tables.items():
        given = {"max": spec.max, "high": spec.high, "oom_group": spec.oom_group}
        out[alias] = {**out.get(alias, {}), **{k: v for k, v in given.items() if v is not None}}
    return out


def engine_env(plan: Plan) -> dict[str, str]:
    """The environment the engine is given (launch/child.py): where its LLAMA_ARG_HOST/PORT
    come from."""
    return {**os.environ, **plan.launch.env}


def router_url(
    estimate: dict[str, Any] | None, argv: tuple[str, ...], env: Mapping[str, str] | None = None
) -> str | None:
    """llama-server's router: its http://HOST:PORT from this launch's --host/--port
    (LLAMA_ARG_HOST/PORT of ``env``, the engine's), as ready_url finds it; None when the
    engine is no router, or one whose address cannot be known (a UNIX socket: its evict,
    unload and shed's unload are off; preflight's engine.address warning says so)."""
    if estimate is None or "router" not in estimate:
        return None
    url = server_url(*server_address(argv, os.environ if env is None else env))
    return None if url is None else base_url(url)


def needs_watchdog(plan: Plan) -> bool:
    """Whether the governor's death needs a watchdog to clean up after it: the engine's group
    killed (on_governor_exit = "kill"), and under "keep" too the board's clocks given back and
    a shed's victims released (the engine runs on; nothing else would undo them)."""
    holds = any(verbs.needs_watchdog(a.verb) for rule in plan.watch for a in rule.actions)
    return plan.launch.on_governor_exit == "kill" or bool(plan.clocks) or holds


def ready_url(
    entry: compiled.Compiled, argv: tuple[str, ...], env: Mapping[str, str] | None = None
) -> str | None:
    """The URL that answers once the engine is ready: engine.ready's, else llama-server's
    /health from this launch's --host/--port (LLAMA_ARG_HOST/PORT of ``env``, the engine's),
    None: ready at exec (also for a server whose address cannot be known)."""
    if not entry.ready_server:
        return entry.ready_url
    return server_url(*server_address(argv, os.environ if env is None else env))


def serve_metrics(where: tuple[str, int], states: Callable[[], list[RunState]]) -> Endpoint:
    """--metrics: bind before anything is applied (a busy port is 69 with nothing changed),
    then serve /metrics from a thread until the run ends. prometheus_client is imported here
    and only here (the lean launch path never loads it without --metrics)."""
    from governor.metrics.export import serve  # lazy: --metrics only (prometheus_client)

    endpoint = serve(where[0], where[1], states, run_dir())
    sys.stderr.write(f"governor: metrics at {endpoint.url}\n")
    sys.stderr.flush()
    return endpoint


def _cache_options(opts: HostOptions, lopts: LaunchOptions, backend_name: str) -> list[str]:
    """What besides the policy and the argv keys the cache entry (a change compiles again)."""
    return [
        str(opts.root),
        str(opts.cgroup_root),
        str(opts.sysfs_root),
        ",".join(sorted(opts.allow_missing)),
        backend_name,
        str(lopts.force),
        _cpu_signature(opts),
    ]


def compiled_for_launch(
    path: Path,
    argv: tuple[str, ...],
    opts: HostOptions,
    lopts: LaunchOptions,
    backend_name: str,
    *,
    cwd: Path | None = None,
    cache: Path | None = None,
) -> tuple[compiled.Compiled, HostFacts]:
    """The plan cache's entry for this launch, else a compile (which stores it). ``cwd`` and
    ``cache`` stand for another process's view (install compiles for the service: cwd /, the
    cache directory of root without GOVERNOR_CACHE_DIR)."""
    name = None
    if lopts.plan_cache:
        options = _cache_options(opts, lopts, backend_name)
        name = compiled.entry_name(path, argv, options=options, cwd=cwd or Path.cwd())
    if name is not None:
        hit = compiled.lookup(
            name,
            root=opts.root,
            cgroup_root=opts.cgroup_root,
            directory=cache,
            sysfs_root=opts.sysfs_root,
        )
        if hit is not None:
            log.debug("plan_cache.hit", entry=name)
            return hit
    if lopts.isolate_compile:
        return _compile_isolated(path, argv, opts, lopts, backend_name, name=name)
    # lazy: a miss in this process (typer's launch, install): the compile-time stack
    from governor.api.launch_compile import compile_launch

    entry, host = compile_launch(
        path, argv, opts, force=lopts.force, backend_name=backend_name, cwd=cwd or Path.cwd()
    )
    if name is not None:
        compiled.store(name, entry, directory=cache)
    return entry, host


def _compile_isolated(
    path: Path,
    argv: tuple[str, ...],
    opts: HostOptions,
    lopts: LaunchOptions,
    backend_name: str,
    *,
    name: str | None,
) -> tuple[compiled.Compiled, HostFacts]:
    """The compile (and the store) in a short-lived child; this process reads the entry back
    from its pipe and never imports the compile-time stack (governor/api/isolate.py)."""
    # lazy: a miss only (the fork and its pipe)
    from governor.api.isolate import run_isolated

    def work() -> bytes:
        # lazy: in the child only, which ends after the compile
        from governor.api.launch_compile import compile_launch

        entry, host = compile_launch(
            path, argv, opts, force=lopts.force, backend_name=backend_name, cwd=Path.cwd()
        )
        if name is not None:
            compiled.store(name, entry)
        return json.dumps({"entry": entry.to_json().decode(), "host": host.to_dict()}).encode()

    watchdog = lopts.watchdog
    close = () if watchdog is None or watchdog.fd is None else (watchdog.fd,)
    raw = json.loads(run_isolated(work, debug=lopts.debug, close=close))
    entry = replace(compiled.Compiled.from_json(raw["entry"].encode()), from_cache=False)
    return entry, HostFacts.from_dict(raw["host"])


def _cpu_signature(opts: HostOptions) -> str:
    """What the GGUF estimate reads from the CPU (its repack family): machine + flags."""
    text = ProcFs(opts.root / "proc").cpuinfo()
    machine = cpuinfo_machine(text, os.uname().machine)
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return f"{machine}|{line.partition(':')[2].strip()}"
    return machine
