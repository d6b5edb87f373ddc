"""Composition root: builds the objects each command needs from its arguments.

The CLI calls only these functions; tests call them too, with fixture roots."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from governor.plan.compiler import Workload
    from governor.plan.doctor import Finding
    from governor.plan.host import HostFacts
    from governor.plan.model import Plan
    from governor.policy.model import Policy


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
    from governor.plan.compiler import compile_plan

    policy = load_policy(path)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
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


def _backend(plan: Plan) -> Any:
    from governor.backends.cgroupfs import CgroupfsBackend
    from governor.kernel.cgroupfs import CgroupFs

    return CgroupfsBackend(CgroupFs(Path(plan.cgroup_root)))


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


def resolve_executable(argv0: str, path_env: str | None) -> str:
    """Find the engine like execvp would, before anything is applied (127 / 126)."""
    import os
    import shutil

    from governor.errors import LaunchError

    found = argv0 if "/" in argv0 else shutil.which(argv0, mode=os.F_OK, path=path_env)
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


def _child_setup(plan: Plan, executable: str, argv: tuple[str, ...]) -> Any:
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


def _announce(plan: Plan) -> None:
    """Say plainly, on stderr, where the engine runs and which limits are (not) in force."""
    import sys

    from governor.plan.render import enforcement

    on, off = enforcement(plan)
    out = sys.stderr
    out.write(f"governor: {plan.policy} -> {plan.cgroup_root}/{plan.leaf}\n")
    out.write(f"governor: enforced: {', '.join(on)}\n")
    for line in off:
        out.write(f"governor: NOT enforced: {line}\n")
    out.flush()


def launch(path: Path, argv: tuple[str, ...], opts: HostOptions, lopts: LaunchOptions) -> int:
    """`governor launch`: check everything, apply, run the engine in the leaf, clean up.

    Returns the engine's exit status (128+N when it died of signal N)."""
    import os
    import time

    import structlog

    from governor.engines.checks import engine_warnings, read_engine_argv
    from governor.errors import PolicyError, UsageError
    from governor.launch.launcher import Launcher
    from governor.launch.watchdog import start_watchdog
    from governor.plan.compiler import Workload, compile_plan

    log = structlog.get_logger("governor.launch")
    if not argv:
        raise UsageError(
            "no engine command given (command line)",
            hint="governor launch --policy P -- ENGINE ARGS...",
        )
    policy = load_policy(path)
    args = read_engine_argv(policy, argv)
    executable = resolve_executable(argv[0], os.environ.get("PATH"))
    model_bytes = _model_bytes(args)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    plan = compile_plan(
        policy,
        host,
        workload=Workload(model_bytes=model_bytes),
        allow_missing=opts.allow_missing,
        source=str(path),
    )
    if plan.launch.memlock == "model":
        raise PolicyError(
            'process.memlock = "model" needs the engine\'s model file',
            file=str(path),
            field="process.memlock",
            hint="pass the model with -m, or give memlock as a size",
        )
    for warning in engine_warnings(args, plan, host):
        log.warning("engine.argv", message=warning)
    _announce(plan)
    setup = _child_setup(plan, executable, argv)

    backend = _backend(plan)
    launcher = Launcher(backend.fs, proc_root=opts.root / "proc")
    with backend.lock(plan):
        backend.apply(plan)
        watchdog = (
            start_watchdog(lambda: backend.remove(plan))
            if plan.launch.on_governor_exit == "kill"
            else None
        )
        try:
            started = time.monotonic()
            try:
                pid = launcher.start(plan, setup)
            except BaseException:
                backend.remove(plan)
                raise
            code, sig = launcher.supervise(plan, pid, started=started)
            report = launcher.summarize(
                plan, pid=pid, argv=argv, code=code, sig=sig, wall=time.monotonic() - started
            )
            log.info("engine.exit", **{k: v for k, v in vars(report).items() if k != "argv"})
            if lopts.report is not None:
                lopts.report.write_text(report.to_json() + "\n")
            if not lopts.keep:
                backend.remove(plan)
        finally:
            if watchdog is not None:
                watchdog.disarm()
    return code
