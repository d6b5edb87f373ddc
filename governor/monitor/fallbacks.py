"""What a kernel older than the governor's interfaces lacks, done by the ones it has (issue 37:
the boards' 5.10).

- kill_tree (cgroup.kill is 5.14+) lives in governor/kernel/kill.py: the prefetch helper
  kills its group the same way.
- :func:`reclaim_by_high`: memory.reclaim is 5.19+. Without it: memory.high := memory.current - N
  (never below memory.min), which the kernel reclaims down to within that write
  (mm/memcontrol.c memory_high_write, 5.8+), then the old value at once.
"""

from __future__ import annotations

from governor.errors import BackendError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs

NO_MEMORY_RECLAIM = "no memory.reclaim (Linux < 5.19): memory.high"


def reclaim_by_high(
    fs: CgroupFs, cgroup: str, amount: int, current: int | None, *, lower: int, page: int
) -> str:
    """memory.reclaim's job without it: memory.high := current - amount (not below ``lower``,
    memory.min), page-floored, then the value it had. Returns what was done."""
    old = fs.read(cgroup, kf.MEMORY_HIGH).strip()
    if current is None:
        raise BackendError("no memory.current to reclaim from", cgroup=cgroup)
    target = max(current - amount, lower) // page * page
    if target >= current:
        return f"{NO_MEMORY_RECLAIM} not lowered: memory.min protects what is in use"
    try:
        fs.write(cgroup, kf.MEMORY_HIGH, str(target))
    finally:
        fs.write(cgroup, kf.MEMORY_HIGH, old)
    return f"{NO_MEMORY_RECLAIM} lowered to {target} for one write, then {old} again"
