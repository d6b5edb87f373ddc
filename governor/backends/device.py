"""[device] memory at preflight: can the board give the engine the device memory it needs?

memcg cannot bound it (contiguous NPU buffers are charged to no cgroup:
docs/devices.md), so the one place to refuse it is before anything is applied, against what the
board has now: MemAvailable (pool "system": the page allocator, where rknpu's IOMMU and
shmem-backed buffers come from) or CmaFree (pool "cma": a board whose NPU/GPU buffers must be
physically contiguous); from MemAvailable the memory.min the other governed groups in the
slice hold is taken away (a protected page counts in MemAvailable, but the kernel will not
reclaim it for us).

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
    # protected pages are ordinary memory: they are in MemAvailable, not (as such) in CmaFree
    others = others if pool == "system" else 0
    left = max(have - others, 0)
    if need > left:
        said = "" if reason == "device.memory" else f" ({reason})"
        minus = (
            f" minus {human_bytes(others)} held by other governed groups' memory.min ="
            f" {human_bytes(left)}"
            if pool == "system"
            else ""
        )
        raise PolicyError(
            f"device memory {human_bytes(need)}{said} ({need} bytes) does not fit what the"
            f" board can give: {key} {human_bytes(have)}{minus}",
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


# ------------------------------------------------------------------ what no slice was charged


def _board_used(proc: ProcFs) -> int | None:
    try:
        m = proc.meminfo()
        return m["MemTotal"] - m["MemAvailable"]
    except (OSError, ValueError, KeyError):
        return None


def _slices_current(fs: CgroupFs, slice_: str) -> int | None:
    try:
        return int(fs.read(slice_, kf.MEMORY_CURRENT).split()[0])
    except (GovernorError, ValueError, IndexError):
        return None


def board_baseline(fs: CgroupFs, proc: ProcFs, slice_: str) -> dict[str, int] | None:
    """What the board used (MemTotal - MemAvailable) and the governed slice charged
    (memory.current of the slice that holds every governed group) when the engine started;
    None without the memory controller or MemAvailable."""
    used, charged = _board_used(proc), _slices_current(fs, slice_)
    if used is None or charged is None:
        return None
    return {"used": used, "slices": charged}


def board_unaccounted(
    baseline: Mapping[str, int] | None, fs: CgroupFs, proc: ProcFs, slice_: str
) -> int | None:
    """Memory the board lost since the baseline that no slice was charged for:
    Δ(MemTotal - MemAvailable) - Δ(slices' memory.current). Contiguous NPU buffers, kernel
    allocations and processes outside the slices land here (negative: the board got memory
    back from outside the slices). None when the baseline or a reading is missing."""
    if not baseline:
        return None
    used, charged = _board_used(proc), _slices_current(fs, slice_)
    if used is None or charged is None:
        return None
    return (used - baseline["used"]) - (charged - baseline["slices"])


def cma(proc: ProcFs) -> dict[str, int]:
    """CmaTotal / CmaFree in bytes (empty without CONFIG_CMA)."""
    try:
        m = proc.meminfo()
    except (OSError, ValueError):
        return {}
    return {k: m[k] for k in ("CmaTotal", "CmaFree") if k in m}
