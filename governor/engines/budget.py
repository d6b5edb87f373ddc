"""The GGUF-aware memory budget check: glue between the pure estimate, the host and the plan.

When the engine's model is a GGUF file, this is THE budget check of `governor launch` and
`governor check --engine-argv` (the file-size check in launch/prefetch.py is then skipped):
an argv whose estimate exceeds the policy's memory.max is refused with exit 65 before anything
is applied, unless --force.
"""

from __future__ import annotations

import platform
from pathlib import Path

from governor.engines.estimate import Estimate, cpu_family, estimate, settings_from_argv
from governor.engines.gguf import read_gguf_cached as read_gguf
from governor.engines.llama import EngineArgs, model_parts
from governor.errors import HostError, PolicyError
from governor.kernel import files as kf
from governor.kernel.procfs import ProcFs
from governor.log import get_logger
from governor.plan.model import Plan
from governor.policy.model import Policy

log = get_logger(__name__)


def host_family(root: Path) -> str:
    """The repack family of this host's CPU (x86-avx2, arm-dotprod, ...)."""
    return cpu_family(platform.machine(), ProcFs(root / "proc").cpuinfo())


def is_gguf(args: EngineArgs | None) -> bool:
    return args is not None and args.model is not None and args.model.endswith(".gguf")


def estimate_argv(args: EngineArgs, *, root: Path, budget: int | None) -> Estimate:
    """Read the model's header (all parts of a split GGUF) and estimate the argv."""
    assert args.model is not None
    parts = model_parts(args.model)
    info = read_gguf(parts[0])
    if len(parts) > 1:  # tensors of the other parts: their sizes add to the weights
        from dataclasses import replace

        extra = tuple(t for p in parts[1:] for t in read_gguf(p).tensors)
        info = replace(info, tensors=info.tensors + extra)
    return estimate(
        info, settings_from_argv(args, info.n_ctx_train), family=host_family(root), budget=budget
    )


def memory_limit(plan: Plan, file: str = kf.MEMORY_MAX) -> int | None:
    """The byte value the plan writes to ``file`` on its group (None: "max" or not written)."""
    for w in plan.writes:
        if w.cgroup == plan.group and w.file == file and w.value != "max":
            return int(w.value)
    return None


def check_launch(
    args: EngineArgs | None, plan: Plan, *, root: Path, force: bool
) -> Estimate | None:
    """Estimate a GGUF argv against the plan's memory.max: 65 when it will not fit (unless
    ``force``); None when the model is not a GGUF (the file-size check applies then)."""
    if not is_gguf(args):
        return None
    assert args is not None
    budget = memory_limit(plan)
    try:
        est = estimate_argv(args, root=root, budget=budget)
    except HostError as err:
        if "gguf" not in err.missing:
            raise
        # without the optional `gguf` package, launch falls back to the file-size check
        log.warning("estimate.unavailable", message=str(err), hint=err.hint)
        return None
    log.debug("estimate.done", total=est.total, budget=budget, fits=est.fits, max_ctx=est.max_ctx)
    high = memory_limit(plan, kf.MEMORY_HIGH)
    if high is not None and est.total > high:
        log.warning(
            "estimate.above_high",
            message=f"estimated {est.total >> 20} MiB is above memory.high {high >> 20} MiB:"
            " the engine will be throttled and its file pages reclaimed",
        )
    if est.fits:
        return est
    if force:
        log.warning("estimate.forced", total=est.total, budget=budget)
        return est
    assert budget is not None
    terms = " + ".join(f"{t.name} {t.bytes >> 20}" for t in est.terms)
    fixes = "; ".join(est.advice)
    raise PolicyError(
        f"llama.cpp will need ~{est.total >> 20} MiB ({terms} MiB; {est.total} bytes), above"
        f" memory.max {budget >> 20} MiB ({budget} bytes)",
        file=plan.source,
        field="memory.max",
        hint=f"{fixes}; or pass --force to launch anyway (governor estimate shows the terms)",
    )


def policy_budget(policy: Policy, *, root: Path) -> int | None:
    """The policy's memory.max in bytes on the host under ``root`` (percentages of MemTotal);
    None when it has none, or when it is given relative to the model ("model")."""
    size = policy.memory.max
    if size is None or size.kind == "model":
        return None
    try:
        mem_total = ProcFs(root / "proc").meminfo().get("MemTotal", 0)
    except (OSError, ValueError):
        mem_total = 0
    return size.resolve(mem_total)
