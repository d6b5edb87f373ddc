"""What every command that touches a host starts with: where to look (HostOptions), the policy
loaded, the host probed, the plan compiled, and for an engine the preflight."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from governor.backends.cgroupfs import CgroupfsBackend
from governor.backends.device import check_device as fit
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.plan.host import HostFacts, probe
from governor.record import field, record

# Compile time stays out of this module's imports: the lean launch path (governor/main.py)
# imports it, so policy/, the compiler and engines/ are imported inside the functions that
# compile (each marked "lazy: compile time").

if TYPE_CHECKING:
    from governor.compile.compiler import Workload
    from governor.engines.preflight import Preflight
    from governor.plan.model import Plan
    from governor.policy.model import Policy


@record(frozen=True)
class HostOptions:
    """Where to look: the filesystem root for /proc and /sys, and the cgroup2 mount."""

    root: Path = Path("/")
    cgroup_root: Path | None = None
    allow_missing: frozenset[str] = field(default_factory=frozenset)
    sysfs_root: Path | None = None  # where [clocks] finds cpufreq/devfreq (default: root/sys)


def sysfs_root(opts: HostOptions) -> Path:
    """Where the board's clocks are (and every clock write must stay)."""
    return opts.sysfs_root if opts.sysfs_root is not None else opts.root / "sys"


def load_policy(path: Path) -> Policy:
    from governor.policy.loader import load  # lazy: compile time (pydantic)

    return load(path)


def probe_host(opts: HostOptions, *, target: str | None = None) -> HostFacts:
    return probe(opts.root, cgroup_root=opts.cgroup_root, target=target, sysfs_root=opts.sysfs_root)


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
    return compile_policy(policy, host, opts, path, workload=workload, attach=attach)


def compile_policy(
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
    from governor.compile.compiler import Workload, compile_plan  # lazy: compile time

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


def preflight_engine(
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
    from governor.engines.preflight import engine_args, model_bytes, preflight  # lazy: compile

    policy = load_policy(path)
    args = engine_args(
        policy.engine.kind,
        policy.engine.max_context_tokens,
        argv,
        max_cache_ram=policy.engine.max_cache_ram,
        env={**os.environ, **policy.process.env},  # what the engine will be given
    )
    size = model_bytes(args)
    if policy.engine.kind == "rkllm":
        from governor.engines.rkllm import check_rkllm  # lazy: compile time, rkllm only

        size = check_rkllm(argv, policy.engine.max_context_tokens)[1]
    target = f"{policy.slice}/{policy.name}" if probe_target else None
    host = probe_host(opts, target=target)
    plan = compile_policy(policy, host, opts, path, model_bytes=size)
    checked = preflight(plan, args, root=opts.root, cwd=cwd or Path.cwd(), force=force, host=host)
    return plan, host, checked


def check_device(plan: Plan, opts: HostOptions) -> int | None:
    """[device] memory against the board now (governor/backends/device.py): run at every
    check and launch, never cached (MemAvailable moves)."""
    if plan.device is None:
        return None
    return fit(plan, CgroupFs(Path(plan.cgroup_root)), ProcFs(opts.root / "proc"))


def cgroupfs_backend(plan: Plan) -> CgroupfsBackend:
    return CgroupfsBackend(CgroupFs(Path(plan.cgroup_root)))
