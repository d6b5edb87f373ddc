"""What a shed never takes (issue 23, governor/monitor/actions/shedder.py): this process's own
cgroup; and the groups a board file's entry may not be (every published plan's). The victims
themselves are the board's slices (governor/board/scan.py), in the one victim order
(governor/board/order.py)."""

from __future__ import annotations

from pathlib import Path

from governor.backends.placement import parse_proc_cgroup
from governor.kernel.procfs import ProcFs
from governor.rundir.state import read_states


def governed_groups(run: Path) -> list[str]:
    """The group of every published plan, live or stale: what a board entry may not be,
    contain or lie inside (governor/board/file.py)."""
    plans = (st.plan for st in read_states(run))
    return sorted({p.group for p in plans if p is not None and isinstance(p.group, str)})


def own_process_cgroup() -> str | None:
    """This process's cgroup2 path (/proc/self/cgroup): a shedder never takes it, its
    ancestors or its descendants. None when /proc says none, or the root (every cgroup lies
    inside it: none is excluded for it)."""

    try:
        own = parse_proc_cgroup(ProcFs().self_cgroup())
    except (OSError, ValueError):
        return None
    return own or None
