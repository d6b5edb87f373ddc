"""`governor launch` in the composition root: the compiled plan (cached, else compiled with
every refusal launch makes before it applies anything), the child's setup, then the supervisor
(governor/supervise/supervisor.py)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.api.host import (
    HostOptions,
    cgroupfs_backend,
    check_device,
    sysfs_root,
)
from governor.api.isolate import run_isolated
from governor.backends.choose import choose
from governor.cache import plans as compiled
from governor.cache.argkey import server_address
from governor.errors import UsageError
from governor.kernel.parse import cpuinfo_machine
from governor.kernel.procfs import ProcFs
from governor.launch.launcher import Launcher
from governor.log import get_logger
from governor.monitor.actions import registry as verbs
from governor.plan.host import HostFacts
from governor.plan.placement import CompiledPlacement
from governor.plan.render import enforcement
from governor.record import record, replace
from governor.rundir.state import run_dir
from governor.supervise.supervisor import Job, Supervisor
from governor.supervise.watchdog import fork_watchdog

if TYPE_CHECKING:
    from governor.cache.plans import Compiled
    from governor.launch.launcher import ChildSetup
    from governor.plan.model import Plan
    from governor.rundir.state import RunState
    from governor.supervise.watchdog import Watchdog

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

    pid1 = ProcFs(opts.root / "proc").pid1_comm()  # "" under hidepid=: not systemd
    return choose(lopts.backend, pid1=pid1)  # type: ignore[arg-type]  # cli validates it


def _launch_backend(
    entry: Compiled, name: str, host: HostFacts, opts: HostOptions
) -> tuple[Plan, Any]:
    """(plan, backend) for launch: the cgroupfs layout, or the compiled placement inside a
    systemd unit (the installed service or a transient scope, whichever this process is in)."""
    if name != "systemd":
        return entry.plan, cgroupfs_backend(entry.plan)
    from governor.backends.systemd import for_launch

    placements = tuple(CompiledPlacement(m, u, c, p) for m, u, c, p in entry.placements)  # type: ignore[arg-type]  # modes written by compile_placements
    return for_launch(
        entry.plan,
        systemd_version=host.systemd_version,
        proc_root=opts.root / "proc",
        placements=placements,
    )


def _systemd_state(full: Plan, backend: Any, host: HostFacts) -> dict[str, Any] | None:
    """For the published state under systemd: the unit carrying the limits and their values."""
    placement = getattr(backend, "placement", None)
    if placement is None or host.systemd_version is None:
        return None
    from governor.backends.manager import describe

    return describe(full, placement.cgroup, host.systemd_version)


def _which(name: str, path_env: str | None) -> str | None:
    """The first $PATH entry holding ``name`` (execvp's search; shutil.which without the
    imports it pulls: bz2, lzma, fnmatch)."""
    import os

    for directory in (path_env if path_env is not None else os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.exists(candidate) and not os.path.isdir(candidate):
            return candidate
    return None


def resolve_executable(argv0: str, path_env: str | None) -> str:
    """Find the engine like execvp would, before anything is applied (127 / 126)."""
    import os

    from governor.errors import LaunchError

    found = argv0 if "/" in argv0 else _which(argv0, path_env)
    if found is None or not os.path.exists(found):
        raise LaunchError(
            f"engine not found: {argv0} (-- ENGINE)",
            exit_code=127,
            hint="give the engine's path after --, e.g. -- ./llama-completion -m model.gguf",
        )
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise LaunchError(
            f"engine is not executable: {found} (-- ENGINE)",
            exit_code=126,
            hint=f"chmod +x {found}",
        )
    return found


def _child_setup(plan: Plan, executable: str, argv: tuple[str, ...]) -> ChildSetup:
    import grp
    import os
    import pwd

    from governor.errors import HostError
    from governor.launch.launcher import ChildSetup

    env = dict(os.environ)
    env.update(plan.launch.env)
    uid = gid = None
    user = home = None
    if plan.launch.user is not None:
        try:
            pw = pwd.getpwnam(plan.launch.user)
        except KeyError:
            raise HostError(
                f"process.user {plan.launch.user!r} does not exist on this host"
                f" ({plan.source or 'policy'}, process.user; /etc/passwd)",
                hint=f"useradd --system {plan.launch.user}, or change process.user",
            ) from None
        uid, gid, user, home = pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir
        env.update({"USER": user, "LOGNAME": user, "HOME": home})
    if plan.launch.group is not None:
        try:
            gid = grp.getgrnam(plan.launch.group).gr_gid
        except KeyError:
            raise HostError(
                f"process.group {plan.launch.group!r} does not exist on this host"
                f" ({plan.source or 'policy'}, process.group; /etc/group)",
                hint=f"groupadd --system {plan.launch.group}, or change process.group",
            ) from None
    return ChildSetup(
        executable=executable,
        argv=argv,
        env=env,
        uid=uid,
        gid=gid,
        user=user,
        home=home,
        pdeathsig=plan.launch.on_governor_exit == "kill",
    )


def _announce(plan: Plan, leaf: str | None = None) -> None:
    """Say plainly, on stderr, where the engine runs and which limits are (not) in force."""

    on, off = enforcement(plan)
    out = sys.stderr
    out.write(f"governor: {plan.policy} -> {plan.cgroup_root}/{leaf or plan.leaf}\n")
    out.write(f"governor: enforced: {', '.join(on)}\n")
    for line in off:
        out.write(f"governor: NOT enforced: {line}\n")
    out.flush()


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
    if lopts.report is not None:
        from governor.api.outputs import check_writable

        check_writable(lopts.report, "--report")
    backend_name = _backend_name(opts, lopts)
    compiled, host = compiled_for_launch(path, argv, opts, lopts, backend_name)
    for event, message in compiled.warnings:
        log.warning(event, message=message)
    check_device(compiled.plan, opts)  # live, also on a cached plan: MemAvailable moves
    admitted = admit_launch(compiled, directory, opts, lopts)  # 75 before anything is applied
    try:
        plan, backend = _launch_backend(compiled, backend_name, host, opts)
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
        _announce(compiled.plan, leaf=plan.leaf)
        job = Job(
            plan=plan,
            setup=_child_setup(plan, executable, argv),
            prefetch_files=compiled.prefetch_files,
            report=lopts.report,
            keep=lopts.keep,
            sample_s=lopts.sample_s,
            psi_triggers=lopts.psi_triggers,
            extra={} if compiled.estimate is None else {"estimate": compiled.estimate},
            backend=backend_name,
            policy_sha256=compiled.chain[0][1] if compiled.chain else None,
            model_bytes=compiled.model_bytes,
            systemd=_systemd_state(compiled.plan, backend, host),
            ready_url=ready_url(compiled, argv),
            ready_timeout_s=plan.engine.ready_timeout_s,
            sysfs_root=str(sysfs_root(opts)),
            run_dir=directory,
            board_release=admitted.release,
            admit_note=admitted.note,
            model_leaves=model_leaves(plan, compiled.estimate),
        )
        proc = ProcFs(opts.root / "proc")
        watchdog = lopts.watchdog
        if watchdog is None and needs_watchdog(plan):
            watchdog = fork_watchdog()
        supervisor = Supervisor(
            backend, Launcher(backend.fs, proc=proc), proc=proc, watchdog=watchdog
        )
        supervisors.append(supervisor)
        return supervisor.run(job)
    finally:
        admitted.release()  # the supervisor releases it as soon as the state is published
        if endpoint is not None:
            endpoint.close()


def admit_launch(
    compiled: Compiled, directory: Path, opts: HostOptions, lopts: LaunchOptions
) -> Any:
    """The board's admission (governor/api/admit.py): the board lock, held until the state is
    published, or AdmissionRefused (75)."""
    from governor.api.admit import admission

    total = (compiled.estimate or {}).get("total")
    return admission(
        compiled.plan,
        run=directory,
        root=opts.root,
        estimate=total if isinstance(total, int) else None,
        force=lopts.force,
    )


def needs_watchdog(plan: Plan) -> bool:
    """Whether the governor's death needs a watchdog to clean up after it: the engine's group
    killed (on_governor_exit = "kill"), and under "keep" too the board's clocks given back and
    a shed's victims released (the engine runs on; nothing else would undo them)."""
    holds = any(verbs.needs_watchdog(a.verb) for rule in plan.watch for a in rule.actions)
    return plan.launch.on_governor_exit == "kill" or bool(plan.clocks) or holds


def ready_url(compiled: Compiled, argv: tuple[str, ...]) -> str | None:
    """The URL that answers once the engine is ready: engine.ready's, else llama-server's
    /health from this launch's --host/--port (LLAMA_ARG_HOST/PORT), None: ready at exec."""
    if not compiled.ready_server:
        return compiled.ready_url

    from governor.supervise.ready import server_url

    return server_url(*server_address(argv, os.environ))


def serve_metrics(where: tuple[str, int], states: Callable[[], list[RunState]]) -> Any:
    """--metrics: bind before anything is applied (a busy port is 69 with nothing changed),
    then serve /metrics from a thread until the run ends. prometheus_client is imported here
    and only here (the lean launch path never loads it without --metrics)."""

    from governor.metrics.export import serve

    endpoint = serve(where[0], where[1], states, run_dir())
    sys.stderr.write(f"governor: metrics at {endpoint.url}\n")
    sys.stderr.flush()
    return endpoint


def compiled_for_launch(
    path: Path,
    argv: tuple[str, ...],
    opts: HostOptions,
    lopts: LaunchOptions,
    backend_name: str,
    *,
    cwd: Path | None = None,
    cache: Path | None = None,
) -> tuple[Compiled, HostFacts]:
    """The plan cache's entry for this launch, else a compile (which stores it). ``cwd`` and
    ``cache`` stand for another process's view (install compiles for the service: cwd /, the
    cache directory of root without GOVERNOR_CACHE_DIR)."""

    name = None
    if lopts.plan_cache:
        options = [
            str(opts.root),
            str(opts.cgroup_root),
            str(opts.sysfs_root),
            ",".join(sorted(opts.allow_missing)),
            backend_name,
            str(lopts.force),
            _cpu_signature(opts),
        ]
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
    from governor.api.launch_compile import compile_launch  # install's compile, in-process

    entry, host = compile_launch(
        path, argv, opts, backend_name, force=lopts.force, cwd=cwd or Path.cwd()
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
) -> tuple[Compiled, HostFacts]:
    """The compile (and the store) in a short-lived child; this process reads the entry back
    from its pipe and never imports the compile-time stack (governor/api/isolate.py)."""

    def work() -> bytes:  # runs in the child: only it imports the compile side
        from governor.api.launch_compile import compile_launch

        entry, host = compile_launch(
            path, argv, opts, backend_name, force=lopts.force, cwd=Path.cwd()
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
