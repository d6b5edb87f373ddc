"""[device] memory at preflight: can the board give the engine the device memory it needs?

memcg cannot bound it (contiguous NPU buffers are charged to no cgroup: README "NPU and GPU
memory"), so the one place to refuse it is before anything is applied, against what the
board has now: MemAvailable (pool "system": the page allocator, where rknpu's IOMMU and
shmem-backed buffers come from) or CmaFree (pool "cma": a board whose NPU/GPU buffers must be
physically contiguous), minus the memory.min the other governed groups in the slice hold (a
protected page counts in MemAvailable but the kernel will not reclaim it for us).

Read live at every launch and check, never from the plan cache: MemAvailable moves.
"""

from __future__ import annotations

from collections.abc import Mapping

from governor.errors import GovernorError, PolicyError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.plan.model import Plan
from governor.sizes import human_bytes

POOL_KEYS = {"system": "MemAvailable", "cma": "CmaFree"}


def others_protection(fs: CgroupFs, plan: Plan) -> int:
    """memory.min of every other group in the plan's slice ("max" counts as nothing can be
    given; a group that cannot be read counts 0)."""
    total = 0
    try:
        siblings = [c for c in fs.children(plan.slice) if c != plan.group]
    except GovernorError:
        return 0
    for child in siblings:
        try:
            text = fs.read(child, kf.MEMORY_MIN).strip()
        except GovernorError:
            continue
        total += 1 << 62 if text == "max" else int(text)
    return total


def fit_device(
    need: int,
    pool: str,
    meminfo: Mapping[str, int],
    others: int,
    *,
    reason: str = "device.memory",
    source: str | None = None,
) -> int:
    """Pure: the bytes the pool can still give (65 when ``need`` is above it)."""
    key = POOL_KEYS[pool]
    if pool == "cma" and not meminfo.get("CmaTotal"):
        raise PolicyError(
            'device.pool = "cma" but this board has no CMA (no CmaTotal in /proc/meminfo)',
            file=source,
            field="device.pool",
            hint='use pool = "system", or boot with cma=SIZE',
        )
    have = meminfo.get(key)
    if have is None:
        raise PolicyError(
            f"/proc/meminfo has no {key}: the board's free device memory is unknown",
            file=source,
            field="device.memory",
            hint="a kernel before 3.14 has no MemAvailable; remove [device] memory",
        )
    left = max(have - others, 0)
    if need > left:
        said = "" if reason == "device.memory" else f" ({reason})"
        raise PolicyError(
            f"device memory {human_bytes(need)}{said} ({need} bytes) does not fit what the"
            f" board can give: {key} {human_bytes(have)} minus {human_bytes(others)} held by"
            f" other governed groups' memory.min = {human_bytes(left)}",
            file=source,
            field="device.memory",
            hint="stop another engine or free memory on the board, or lower device.memory"
            " (a smaller model)",
        )
    return left


def check_device(plan: Plan, fs: CgroupFs, proc: ProcFs) -> int | None:
    """The preflight of plan.device on this board now; None when the plan has no [device]."""
    spec = plan.device
    if spec is None:
        return None
    if spec.memory == "model":
        raise PolicyError(
            'device.memory = "model" needs the engine\'s model file',
            file=plan.source,
            field="device.memory",
            hint="pass the model on the engine's command line, or give device.memory as a size",
        )
    try:
        meminfo = proc.meminfo()
    except (OSError, ValueError) as err:
        raise PolicyError(
            f"cannot read /proc/meminfo for device.memory: {err}",
            file=plan.source,
            field="device.memory",
        ) from err
    return fit_device(
        spec.memory,
        spec.pool,
        meminfo,
        others_protection(fs, plan),
        reason=spec.reason,
        source=plan.source,
    )
