"""Kill a cgroup's subtree, on every kernel (issue 37: the boards' 5.10; issue 43: one function
for the monitor's kill and the prefetch helper's fail-closed kill).

cgroup.kill (5.14+) SIGKILLs the subtree race-free. Without it: freeze the subtree
(cgroup.freeze, 5.2+: nothing forks away meanwhile; a frozen task still dies of SIGKILL), SIGKILL
each pid of each cgroup.procs until none is left, thaw. A caller inside the group (the prefetch
helper, born in the engine's leaf) cannot freeze it: the freeze would stop the caller too, on
its way back to user space, before its first SIGKILL; it is spared and kills round after round
unfrozen instead. What was done is returned, as said, for the action's report.
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
NO_CGROUP_KILL = "no cgroup.kill (Linux < 5.14)"


def kill_tree(
    fs: CgroupFs,
    cgroup: str,
    kill: Callable[[int, int], None] = os.kill,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wait_s: float = KILL_WAIT_S,
    inside: int | None = None,
) -> str | None:
    """SIGKILL every process in ``cgroup``'s subtree: None when cgroup.kill did it, else how
    the kernel without it was made to do the same (see the module). ``inside``: the caller's
    pid when it is in the group itself (never frozen, never killed). A group that still has
    other processes after ``wait_s`` is a BackendError (a task stuck in D state)."""
    try:
        fs.kill(cgroup)
        return None
    except BackendError as err:
        if err.errno != errno.ENOENT or not fs.exists(cgroup):
            raise
    thaw = False
    if inside is not None:
        how = "the group not frozen (the caller is in it)"
    else:
        try:
            fs.freeze(cgroup, True)
            how, thaw = "froze the group", True
        except GovernorError as err:
            how = f"could not freeze the group ({err})"
    try:
        deadline = clock() + wait_s
        while pids := [p for p in fs.procs_below(cgroup, strict=True) if p != inside]:
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
        if thaw:
            with contextlib.suppress(GovernorError):
                fs.freeze(cgroup, False)
    return f"{NO_CGROUP_KILL}: {how}, SIGKILLed each pid"
