"""Composition root: builds the objects each command needs from its arguments.

The CLI calls only these functions; tests call them too, with fixture roots."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.log import get_logger

if TYPE_CHECKING:
    from governor.compiled import Compiled
    from governor.launch.launcher import ChildSetup
    from governor.launch.watchdog import Watchdog
    from governor.plan.compiler import Workload
    from governor.plan.doctor import Finding
    from governor.plan.host import HostFacts
    from governor.plan.model import Plan
    from governor.policy.model import Policy

log = get_logger("governor.launch")


@dataclass(frozen=True)
class HostOptions:
    """Where to look: the filesystem root for /proc and /sys, and the cgroup2 mount."""

    root: Path = Path("/")
    cgroup_root: Path | None = None
    allow_missing: frozenset[str] = field(default_factory=frozenset)


def load_policy(path: Path) -> Policy:
    from governor.policy.loader import load

    return load(path)


def probe_host(opts: HostOptions, *, target: str | None = None) -> HostFacts:
    from governor.plan.host import probe

    return probe(opts.root, cgroup_root=opts.cgroup_root, target=target)


def check(path: Path, opts: HostOptions, *, workload: Workload | None = None) -> Plan:
    """load + probe + compile: what every command that touches a host starts with."""
    policy = load_policy(path)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    return _compile(policy, host, opts, path, workload=workload)


def _compile(
    policy: Policy,
    host: HostFacts,
    opts: HostOptions,
    path: Path,
    *,
    workload: Workload | None = None,
    model_bytes: int | None = None,
) -> Plan:
    """compile_plan with the options every command passes the same way."""
    from governor.plan.compiler import Workload, compile_plan

    if workload is None and model_bytes is not None:
        workload = Workload(model_bytes=model_bytes)
    return compile_plan(
        policy, host, workload=workload, allow_missing=opts.allow_missing, source=str(path)
    )


def doctor(opts: HostOptions) -> tuple[HostFacts, list[Finding]]:
    from governor.plan.doctor import diagnose

    host = probe_host(opts)
    return host, diagnose(host)


def schema() -> dict[str, Any]:
    from governor.policy.model import Policy

    out = Policy.model_json_schema(by_alias=True, mode="validation")
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "governor policy"
    return out


@dataclass(frozen=True)
class LaunchOptions:
    report: Path | None = None
    keep: bool = False
    sample_s: float = 1.0  # the monitor's sampler interval (memory.current/peak/stat)
    backend: str = "cgroupfs"  # cgroupfs | systemd | auto (governor/backends/systemd.py)
    force: bool = False  # launch even when the GGUF estimate exceeds memory.max
    psi_triggers: bool = True  # False: evaluate PSI rules by polling total= (--psi poll)
    watchdog: Watchdog | None = None  # forked early by governor.main; else forked here
    plan_cache: bool = True  # look up / store the compiled plan (governor/compiled.py)


def _backend(plan: Plan) -> Any:
    from governor.backends.cgroupfs import CgroupfsBackend
    from governor.kernel.cgroupfs import CgroupFs

    return CgroupfsBackend(CgroupFs(Path(plan.cgroup_root)))


def _backend_name(opts: HostOptions, lopts: LaunchOptions) -> str:
    """Resolve --backend auto before probing (the systemd layout probes no slice path)."""
    if lopts.backend == "cgroupfs":
        return "cgroupfs"
    from governor.backends.systemd import choose
    from governor.kernel.procfs import ProcFs

    pid1 = ProcFs(opts.root / "proc").pid1_comm()  # "" under hidepid=: not systemd
    return choose(lopts.backend, pid1=pid1)  # type: ignore[arg-type]  # cli validates it


def _launch_backend(plan: Plan, name: str, host: HostFacts, opts: HostOptions) -> Any:
    """(plan, backend) for launch: the cgroupfs layout, or the delegated part of the plan
    inside a systemd unit (service or transient scope)."""
    if name != "systemd":
        return plan, _backend(plan)
    from governor.backends.systemd import for_launch

    return for_launch(plan, systemd_version=host.systemd_version, proc_root=opts.root / "proc")


def apply(path: Path, opts: HostOptions) -> Plan:
    """`governor apply`: create the slice with its limits, no process."""
    plan = check(path, opts)
    _backend(plan).apply(plan)
    return plan


def remove(path: Path, opts: HostOptions) -> Any:
    """`governor remove`: kill what runs in the policy's group and remove its cgroups."""
    from governor.plan.compiler import compile_plan

    policy = load_policy(path)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    # removal must work even where the limits could not be enforced any more
    everything = frozenset({"memory", "cpu", "cpuset", "io", "pids", "psi"})
    plan = compile_plan(policy, host, allow_missing=everything, source=str(path))
    return _backend(plan).remove(plan)


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
            f"engine not found: {argv0} (command line)",
            exit_code=127,
            hint="give the engine's path after --, e.g. -- ./llama-completion -m model.gguf",
        )
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise LaunchError(
            f"engine is not executable: {found} (command line)",
            exit_code=126,
            hint=f"chmod +x {found}",
        )
    return found


def _model_bytes(args: Any) -> int | None:
    """Size of the engine's model file(s) (all parts of a split GGUF); 66 when missing."""
    from governor.engines.llama import model_parts
    from governor.errors import PolicyNotFound

    if args is None or args.model is None:
        return None
    total = 0
    for part in model_parts(args.model):
        try:
            total += part.stat().st_size
        except OSError as err:
            raise PolicyNotFound(
                f"model file not found: {part} ({err.strerror})",
                file="engine argv",
                field="-m/--model",
                hint="check the model path after -m",
            ) from err
    return total


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
                f"process.user {plan.launch.user!r} does not exist on this host",
                hint=f"useradd --system {plan.launch.user}, or change process.user",
            ) from None
        uid, gid, user, home = pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir
        env.update({"USER": user, "LOGNAME": user, "HOME": home})
    if plan.launch.group is not None:
        try:
            gid = grp.getgrnam(plan.launch.group).gr_gid
        except KeyError:
            raise HostError(
                f"process.group {plan.launch.group!r} does not exist on this host",
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
    import sys

    from governor.plan.render import enforcement

    on, off = enforcement(plan)
    out = sys.stderr
    out.write(f"governor: {plan.policy} -> {plan.cgroup_root}/{leaf or plan.leaf}\n")
    out.write(f"governor: enforced: {', '.join(on)}\n")
    for line in off:
        out.write(f"governor: NOT enforced: {line}\n")
    out.flush()


def launch(path: Path, argv: tuple[str, ...], opts: HostOptions, lopts: LaunchOptions) -> int:
    """`governor launch`: the compiled plan (cached, else compiled with every pre-apply
    refusal), then the supervisor. Returns the engine's status (128+N for signal N)."""
    import os

    from governor.errors import UsageError
    from governor.kernel.procfs import ProcFs
    from governor.launch.launcher import Launcher
    from governor.launch.watchdog import fork_watchdog
    from governor.supervisor import Job, Supervisor

    if not argv:
        raise UsageError(
            "no engine command given (command line)",
            hint="governor launch --policy P -- ENGINE ARGS...",
        )
    executable = resolve_executable(argv[0], os.environ.get("PATH"))
    backend_name = _backend_name(opts, lopts)
    compiled, host = compiled_for_launch(path, argv, opts, lopts, backend_name)
    for event, message in compiled.warnings:
        log.warning(event, message=message)
    plan, backend = _launch_backend(compiled.plan, backend_name, host, opts)
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
    )
    proc = ProcFs(opts.root / "proc")
    watchdog = lopts.watchdog
    if watchdog is None and plan.launch.on_governor_exit == "kill":
        watchdog = fork_watchdog()
    supervisor = Supervisor(backend, Launcher(backend.fs, proc=proc), proc=proc, watchdog=watchdog)
    return supervisor.run(job)


def compiled_for_launch(
    path: Path, argv: tuple[str, ...], opts: HostOptions, lopts: LaunchOptions, backend_name: str
) -> tuple[Compiled, HostFacts]:
    """The plan cache's entry for this launch, else a compile (which stores it)."""
    from governor import compiled

    name = None
    if lopts.plan_cache:
        options = [
            str(opts.root),
            str(opts.cgroup_root),
            ",".join(sorted(opts.allow_missing)),
            backend_name,
            str(lopts.force),
            _cpu_signature(opts),
        ]
        name = compiled.entry_name(path, argv, options=options, cwd=Path.cwd())
    if name is not None:
        hit = compiled.lookup(name, root=opts.root, cgroup_root=opts.cgroup_root)
        if hit is not None:
            log.debug("plan_cache.hit", entry=name)
            return hit
    entry, host = _compile_launch(path, argv, opts, lopts, backend_name)
    if name is not None:
        compiled.store(name, entry)
    return entry, host


def _cpu_signature(opts: HostOptions) -> str:
    """What the GGUF estimate reads from the CPU (its repack family): machine + flags."""
    import os

    from governor.kernel.procfs import ProcFs

    machine = os.uname().machine
    for line in ProcFs(opts.root / "proc").cpuinfo().splitlines():
        if line.startswith(("flags", "Features")):
            return f"{machine}|{line.partition(':')[2].strip()}"
    return machine


def _compile_launch(
    path: Path, argv: tuple[str, ...], opts: HostOptions, lopts: LaunchOptions, backend_name: str
) -> tuple[Compiled, HostFacts]:
    """Compile time for a launch: policy, host, plan and every refusal before apply."""
    from governor import compiled
    from governor.engines.budget import check_launch
    from governor.engines.checks import engine_warnings, read_engine_argv
    from governor.engines.llama import model_parts
    from governor.errors import PolicyError
    from governor.launch.prefetch import prepare as prepare_prefetch

    policy = load_policy(path)
    args = read_engine_argv(policy, argv)
    model_bytes = _model_bytes(args)
    # under systemd the manager enables controllers along the unit's path itself
    target = None if backend_name == "systemd" else f"{policy.slice}/{policy.name}"
    host = probe_host(opts, target=target)
    plan = _compile(policy, host, opts, path, model_bytes=model_bytes)
    if plan.launch.memlock == "model":
        raise PolicyError(
            'process.memlock = "model" needs the engine\'s model file',
            file=str(path),
            field="process.memlock",
            hint="pass the model with -m, or give memlock as a size",
        )
    warnings = tuple(("engine.argv", w) for w in engine_warnings(args, plan, host))
    # a GGUF model: the estimate (weights + repack + KV + compute) is THE budget check (65)
    estimated = check_launch(args, plan, root=opts.root, force=lopts.force)
    job = prepare_prefetch(
        plan,
        model=args.model if args else None,
        model_bytes=None if estimated is not None else model_bytes,
        cwd=Path.cwd(),
    )
    files = job.files if job is not None else ()
    inputs = [*(str(p) for p in (model_parts(args.model) if args and args.model else [])), *files]
    idents = tuple(i for i in (compiled.file_identity(p) for p in inputs) if i is not None)
    chain = tuple(
        (p, digest) for p in _policy_chain(path) if (digest := compiled.sha256_file(p)) is not None
    )
    entry = compiled.Compiled(
        plan=plan,
        warnings=warnings,
        estimate=estimated.to_dict() if estimated is not None else None,
        prefetch_files=tuple(files),
        prefetch_bytes=sum(i[3] for i in idents if i[0] in files),
        target=target,
        chain=chain,
        inputs=idents,
        host_key=compiled.host_key(host),
    )
    return entry, host


def _policy_chain(path: Path) -> list[str]:
    """The policy file and every file it extends (resolved paths), for the cache's check."""
    import tomllib

    out: list[str] = []
    current: Path | None = path.resolve()
    while current is not None and str(current) not in out:
        out.append(str(current))
        try:
            parent = tomllib.loads(current.read_text()).get("extends")
        except (OSError, ValueError):
            break
        current = (current.parent / parent).resolve() if isinstance(parent, str) else None
    return out


@dataclass(frozen=True)
class MonitorOptions:
    sample_s: float = 1.0
    report: Path | None = None
    cgroup: str | None = None  # watch this cgroup (relative to the root) instead of the plan's
    duration_s: float | None = None  # stop after this long (default: until signalled or gone)
    psi_triggers: bool = True  # False: evaluate PSI rules by polling total= (--psi poll)


def monitor(path: Path, opts: HostOptions, mopts: MonitorOptions) -> dict[str, Any]:
    """`governor monitor`: attach the pressure monitor to an already-running slice (one that
    `governor apply` or systemd created) until SIGINT/SIGTERM or the cgroup is gone."""
    import signal
    import time

    from governor.errors import HostError
    from governor.kernel.cgroupfs import CgroupFs
    from governor.kernel.procfs import ProcFs
    from governor.monitor.loop import Monitor

    plan = check(path, opts)
    if mopts.cgroup is not None:
        plan = plan.with_group(mopts.cgroup)
    fs = CgroupFs(Path(plan.cgroup_root))
    if not fs.exists(plan.group):
        raise HostError(
            f"nothing to monitor: {plan.cgroup_root}/{plan.group} does not exist (cgroup root)",
            hint="start it first (governor apply / launch, or its systemd unit), or pass --cgroup",
        )

    def engine_pids() -> list[int]:
        where = plan.leaf if fs.exists(plan.leaf) else plan.group
        return fs.procs(where)

    stopped: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda n, _f: stopped.append(n))
        for sig in (signal.SIGINT, signal.SIGTERM)
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
    ).start()
    try:
        mon.run(lambda: bool(stopped) or (deadline is not None and time.monotonic() >= deadline))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        out = mon.finish()
    if mopts.report is not None:
        import json

        mopts.report.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return out


@dataclass(frozen=True)
class InstallOptions:
    root: Path = Path("/")  # where etc/systemd/system is written (a DESTDIR)
    dry_run: bool = False
    engine: tuple[str, ...] = ()  # engine argv for the instance's ExecStart= (optional)
    governor: str | None = None  # governor executable in ExecStart= (default: this one)


def _governor_executable() -> str:
    import shutil
    import sys

    beside = Path(sys.executable).with_name("governor")  # the venv's console script
    if beside.exists():
        return str(beside)
    return shutil.which("governor") or "/usr/local/bin/governor"


def install(path: Path, opts: HostOptions, iopts: InstallOptions) -> Any:
    """`governor install`: render the policy's units for this host's systemd and write them."""
    from governor import install as inst
    from governor.backends import dropin
    from governor.backends.systemd import daemon_reload
    from governor.engines.checks import read_engine_argv
    from governor.errors import HostError

    policy = load_policy(path)
    model_bytes = None
    if iopts.engine:
        model_bytes = _model_bytes(read_engine_argv(policy, iopts.engine))
    host = probe_host(opts)  # systemd enables controllers along the unit's path itself
    if host.systemd_version is None:
        raise HostError(
            f"systemd is not PID 1 on the probed host ({host.root}/proc/1/comm: {host.pid1!r})",
            hint="install on the board itself, or render for it with --root of the global"
            " options pointing at a copy of its /proc and /sys",
        )
    plan = _compile(policy, host, opts, path, model_bytes=model_bytes)
    files = dropin.render_install(
        plan,
        host.systemd_version,
        policy_path=str(path.resolve()),
        governor=iopts.governor or _governor_executable(),
        engine=iopts.engine or None,
    )
    live = iopts.root.resolve() == Path("/")
    return inst.install(
        plan.policy,
        files,
        dropin.unit_names(plan),
        root=iopts.root,
        dry_run=iopts.dry_run,
        reload=daemon_reload if live else None,
    )


def uninstall(policy: str, root: Path, *, dry_run: bool = False) -> Any:
    """`governor uninstall`: remove what install wrote for a policy (a file or its name) and
    restore the files it replaced."""
    from governor import install as inst
    from governor.backends.systemd import daemon_reload

    name = load_policy(Path(policy)).name if policy.endswith(".toml") else policy
    live = root.resolve() == Path("/")
    return inst.uninstall(name, root=root, dry_run=dry_run, reload=daemon_reload if live else None)


@dataclass(frozen=True)
class EstimateOptions:
    ctx: int | None = None  # -c (overrides the one in engine_argv)
    engine_argv: tuple[str, ...] = ()  # llama.cpp options to honour (-nr, -ctk, -ub, -lm ...)
    policy: Path | None = None  # budget = the policy's memory.max on this host
    budget: int | None = None  # budget in bytes (instead of a policy)


def estimate(model: Path, opts: HostOptions, eopts: EstimateOptions) -> Any:
    """`governor estimate`: the resident-memory estimate of llama.cpp for a GGUF model."""
    from governor.engines.budget import estimate_argv, policy_budget
    from governor.engines.llama import parse_llama_argv
    from governor.errors import PolicyError

    argv = ["llama", *eopts.engine_argv, "-m", str(model)]
    if eopts.ctx is not None:
        argv += ["-c", str(eopts.ctx)]
    try:
        args = parse_llama_argv(argv)
    except ValueError as err:
        raise PolicyError(str(err), file="--engine-argv", hint="check the engine options") from err
    budget = eopts.budget
    if budget is None and eopts.policy is not None:
        budget = policy_budget(load_policy(eopts.policy), root=opts.root)
    return estimate_argv(args, root=opts.root, budget=budget)


def check_engine(path: Path, opts: HostOptions, argv: tuple[str, ...], *, force: bool) -> Any:
    """`governor check --engine-argv`: the plan plus the engine checks launch would make
    (max_context_tokens, model files, the GGUF budget); returns (plan, estimate, warnings)."""
    from governor.engines.budget import check_launch
    from governor.engines.checks import engine_warnings, read_engine_argv

    policy = load_policy(path)
    args = read_engine_argv(policy, argv)
    model_bytes = _model_bytes(args)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    plan = _compile(policy, host, opts, path, model_bytes=model_bytes)
    est = check_launch(args, plan, root=opts.root, force=force)
    return plan, est, engine_warnings(args, plan, host)


def bench(path: Path, argv: tuple[str, ...], opts: HostOptions, bopts: Any) -> Any:
    """`governor bench`: run the engine under the policy per governor/bench/main.py."""
    from governor.enginebench.main import bench as run_bench

    plan = check(path, opts)
    return run_bench(plan, path, argv, opts, bopts)
