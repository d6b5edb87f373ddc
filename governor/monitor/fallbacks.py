"""What a kernel older than the governor's interfaces lacks, done by the ones it has (issue 37:
the boards' 5.10).

- :func:`kill_tree`: cgroup.kill is 5.14+. Without it: freeze the subtree (cgroup.freeze, 5.2+:
  nothing forks away meanwhile; a frozen task still dies of SIGKILL), SIGKILL each pid of each
  cgroup.procs until none is left, thaw.
- :func:`reclaim_by_high`: memory.reclaim is 5.19+. Without it: memory.high := memory.current - N
  (never below memory.min), which the kernel reclaims down to within that write
  (mm/memcontrol.c memory_high_write, 5.8+), then the old value at once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable

from governor.errors import BackendError, GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs

KILL_WAIT_S = 5.0  # without cgroup.kill: how long SIGKILL rounds go on before giving up
KILL_POLL_S = 0.01
NO_CGROUP_KILL = "no cgroup.kill (Linux < 5.14): froze the group, SIGKILLed each pid"
NO_MEMORY_RECLAIM = "no memory.reclaim (Linux < 5.19): memory.high"


def kill_tree(
    fs: CgroupFs,
    cgroup: str,
    kill: Callable[[int, int], None] = os.kill,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wait_s: float = KILL_WAIT_S,
) -> str | None:
    """SIGKILL every process in ``cgroup``'s subtree. cgroup.kill (5.14+) does it race-free
    (None). Where the kernel has none (ENOENT in a cgroup that exists): freeze the subtree
    (cgroup.freeze, 5.2+: nothing forks away meanwhile; a frozen task still dies of SIGKILL),
    SIGKILL each pid of each cgroup.procs until none is left, thaw (NO_CGROUP_KILL). A group
    that still has processes after ``wait_s`` is a BackendError (a task stuck in D state)."""
    try:
        fs.kill(cgroup)
        return None
    except BackendError as err:
        if err.errno != errno.ENOENT or not fs.exists(cgroup):
            raise
    frozen = False
    with contextlib.suppress(GovernorError):
        fs.freeze(cgroup, True)
        frozen = True
    try:
        deadline = clock() + wait_s
        while pids := fs.procs_below(cgroup, strict=True):
            if clock() >= deadline:
                raise BackendError(
                    f"{len(pids)} process(es) still in the group {wait_s:g}s after SIGKILL",
                    cgroup=cgroup,
                    file=kf.CGROUP_PROCS,
                    hint="a process may be stuck in uninterruptible sleep (D state)",
                )
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # exited since the read
                    kill(pid, signal.SIGKILL)
            sleep(KILL_POLL_S)
    finally:
        if frozen:
            with contextlib.suppress(GovernorError):
                fs.freeze(cgroup, False)
    return NO_CGROUP_KILL


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
