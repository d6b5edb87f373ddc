"""Glue between the pure GGUF estimate and the host: read the model's header, pick the CPU's
repack family, resolve a policy's memory.max as the budget.

The refusal itself (an estimate above memory.max is 65 unless --force) is made by the one
preflight of `governor launch` and `governor check --engine-argv` (governor/engines/preflight.py).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import TYPE_CHECKING

from governor.engines.estimate import (
    Estimate,
    cpu_family,
    estimate,
    settings_from_argv,
)
from governor.engines.gguf import read_gguf_cached as read_gguf
from governor.engines.llama import EngineArgs, model_parts
from governor.kernel.parse import cpuinfo_machine
from governor.kernel.procfs import ProcFs

if TYPE_CHECKING:
    from governor.policy.model import Policy


def host_family(root: Path) -> str:
    """The repack family of this host's CPU (x86-avx2, arm-dotprod, ...)."""
    text = ProcFs(root / "proc").cpuinfo()
    return cpu_family(cpuinfo_machine(text, platform.machine()), text)


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
        info,
        settings_from_argv(args, info.n_ctx_train),
        family=host_family(root),
        budget=budget,
        unsized=args.unsized,
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
