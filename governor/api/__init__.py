"""Composition root: builds the objects each command needs from its arguments.

The CLI calls only these functions; tests call them too, with fixture roots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.record import field, record

if TYPE_CHECKING:
    from governor.engines.preflight import Preflight
    from governor.plan.compiler import Workload
    from governor.plan.doctor import Finding
    from governor.plan.host import HostFacts
    from governor.plan.model import Plan
    from governor.policy.model import Policy


@record(frozen=True)
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


def check(
    path: Path,
    opts: HostOptions,
    *,
    workload: Workload | None = None,
    attach: str | None = None,
) -> Plan:
    """load + probe + compile: what every command that touches a host starts with."""
    policy = load_policy(path)
    host = probe_host(opts, target=attach or f"{policy.slice}/{policy.name}")
    return _compile(policy, host, opts, path, workload=workload, attach=attach)


def _compile(
    policy: Policy,
    host: HostFacts,
    opts: HostOptions,
    path: Path,
    *,
    workload: Workload | None = None,
    model_bytes: int | None = None,
    attach: str | None = None,
) -> Plan:
    """compile_plan with the options every command passes the same way."""
    from governor.plan.compiler import Workload, compile_plan

    if workload is None and model_bytes is not None:
        workload = Workload(model_bytes=model_bytes)
    return compile_plan(
        policy,
        host,
        workload=workload,
        allow_missing=opts.allow_missing,
        source=str(path),
        attach=attach,
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


def _backend(plan: Plan) -> Any:
    from governor.backends.cgroupfs import CgroupfsBackend
    from governor.kernel.cgroupfs import CgroupFs

    return CgroupfsBackend(CgroupFs(Path(plan.cgroup_root)))


def apply(path: Path, opts: HostOptions) -> Plan:
    """`governor apply`: create the slice with its limits, no process."""
    import time

    from governor.rundir.state import Publisher, run_dir
    from governor.rundir.state import applied as applied_state

    plan = check(path, opts)
    backend = _backend(plan)
    # the lock a launch of the same policy holds for its whole run: apply refuses (69) then
    from governor.supervise.supervisor import interruptible

    # a stop signal while the limits are written rolls them back (exit 128+N), as ^C does
    with backend.lock(plan) as locked, interruptible():
        applied = backend.apply(plan)
    created = sorted(set(locked) | set(applied.created))
    # no supervisor: the state holds while the cgroup exists (governor status shows it)
    Publisher(run_dir(), plan.policy).publish(
        applied_state(
            plan.to_dict(),
            policy_path=str(path.resolve()),
            created=created,
            started_at=time.time(),
        )
    )
    return plan


def remove(path: Path, opts: HostOptions) -> Any:
    """`governor remove`: kill what runs in the policy's group and remove its cgroups."""
    from governor.plan.compiler import compile_plan

    policy = load_policy(path)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    # removal must work even where the limits could not be enforced any more
    everything = frozenset({"memory", "cpu", "cpuset", "io", "pids", "psi"})
    plan = compile_plan(policy, host, allow_missing=everything, source=str(path))
    from governor.rundir.state import Publisher, read_states, run_dir

    # `governor apply` (and `launch --keep`) record what they created: then the slice goes
    # only when it is among them (an operator's slice stays). Without a record (/run lost in a
    # reboot, a kept group from before this record existed) an empty slice the plan would
    # create goes, as before
    recorded = [
        s for s in read_states(run_dir()) if s.get("policy") == plan.policy and "created" in s
    ]
    owned: set[str] | None = None
    if recorded:
        owned = {c for state in recorded for c in state.get("created") or ()}
    removed = _backend(plan).remove(plan, owned=owned)

    # the state `governor apply` published; a running launch's is its supervisor's to remove
    if all(
        s.get("source") == "apply" or s.get("stale")
        for s in read_states(run_dir())
        if s.get("policy") == plan.policy
    ):
        Publisher(run_dir(), plan.policy).remove()
    return removed


@record(frozen=True)
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
    from governor.backends.systemd import daemon_reload
    from governor.deploy import dropin
    from governor.deploy import install as inst
    from governor.engines.preflight import engine_args
    from governor.engines.preflight import model_bytes as model_size
    from governor.errors import HostError

    policy = load_policy(path)
    model_bytes = None
    if iopts.engine:
        kind, cap = policy.engine.kind, policy.engine.max_context_tokens
        model_bytes = model_size(engine_args(kind, cap, iopts.engine))
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
    result = inst.install(
        plan.policy,
        files,
        dropin.unit_names(plan),
        root=iopts.root,
        dry_run=iopts.dry_run,
        reload=daemon_reload if live else None,
    )
    if live and not iopts.dry_run and iopts.engine:
        _precompile_for_service(path.resolve(), iopts.engine, opts)
    return result


def _precompile_for_service(policy_path: Path, engine: tuple[str, ...], opts: HostOptions) -> None:
    """Compile the plan the installed service will ask for (its ExecStart= command line, its
    working directory /, root's cache) so that `systemctl start` takes the lean path. Best
    effort: a refusal here is said now and again by the service when it starts."""
    from governor.api.launch import LaunchOptions, compiled_for_launch
    from governor.cache.store import cache_dir
    from governor.errors import GovernorError
    from governor.log import get_logger

    service_opts = HostOptions(root=opts.root, cgroup_root=opts.cgroup_root)
    try:
        compiled_for_launch(
            policy_path,
            engine,
            service_opts,
            LaunchOptions(backend="systemd"),
            "systemd",
            cwd=Path("/"),
            cache=cache_dir(environ={}),
        )
    except GovernorError as err:
        get_logger("governor.install").warning(
            "plan.precompile_failed", message=str(err), hint=err.hint
        )


def uninstall(policy: str, root: Path, *, dry_run: bool = False) -> Any:
    """`governor uninstall`: remove what install wrote for a policy (a file or its name) and
    restore the files it replaced."""
    from governor.backends.systemd import daemon_reload
    from governor.deploy import install as inst

    name = load_policy(Path(policy)).name if policy.endswith(".toml") else policy
    live = root.resolve() == Path("/")
    return inst.uninstall(name, root=root, dry_run=dry_run, reload=daemon_reload if live else None)


@record(frozen=True)
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
    """`governor check --engine-argv`: the plan plus every refusal launch makes before it
    applies anything (the same preflight); returns (plan, estimate, warnings)."""
    plan, _host, checked = _preflight(path, argv, opts, probe_target=True, force=force)
    return plan, checked.estimate, checked.messages


def _preflight(
    path: Path,
    argv: tuple[str, ...],
    opts: HostOptions,
    *,
    probe_target: bool,
    force: bool,
    cwd: Path | None = None,
) -> tuple[Plan, HostFacts, Preflight]:
    """load + engine argv + model + probe + compile + governor/engines/preflight.py: what check
    --engine-argv and launch both run, in this order, before anything is applied."""
    from governor.engines.preflight import engine_args, model_bytes, preflight

    policy = load_policy(path)
    args = engine_args(policy.engine.kind, policy.engine.max_context_tokens, argv)
    size = model_bytes(args)
    target = f"{policy.slice}/{policy.name}" if probe_target else None
    host = probe_host(opts, target=target)
    plan = _compile(policy, host, opts, path, model_bytes=size)
    checked = preflight(plan, args, root=opts.root, cwd=cwd or Path.cwd(), force=force, host=host)
    return plan, host, checked


def init(opts: HostOptions, req: Any) -> Any:
    """`governor init`: a policy for a GGUF model on this board (governor/engines/draft.py)."""
    from governor.engines.draft import draft

    return draft(req, probe_host(opts), root=opts.root)


# launch: the run-time path; operate: status, diff, tune, rollback (their own modules)
from governor.api.attach import MonitorOptions, monitor  # noqa: E402
from governor.api.bench import bench  # noqa: E402
from governor.api.launch import (  # noqa: E402  # after the names they import from here
    LaunchOptions,
    compiled_for_launch,
    launch,
    resolve_executable,
)
from governor.api.operate import diff, metrics, rollback, status, tune  # noqa: E402

__all__ = [
    "LaunchOptions",
    "MonitorOptions",
    "bench",
    "compiled_for_launch",
    "diff",
    "launch",
    "metrics",
    "monitor",
    "resolve_executable",
    "rollback",
    "status",
    "tune",
]
