"""Who a `shed` may take memory from (issue 23, governor/monitor/actions/shedder.py): the other governed
slices whose published run state (governor/rundir/state.py) is live and whose plan's ``[qos]
class`` ranks below the shedder's, and the board file's ungoverned cgroups
(governor/board/file.py) of a lower class."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from governor.backends.placement import parse_proc_cgroup
from governor.board.file import BoardCgroup, read_board
from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.plan.model import QOS_RANK, SHED_STEPS, Plan
from governor.record import record
from governor.rundir.journal import Journal
from governor.rundir.state import RunState, read_states, scan_states

BOARD_DIR = "board"  # <run dir>/board/<name>/journal.jsonl: an ungoverned cgroup's journal


@record(frozen=True)
class Victim:
    name: str  # the policy's, or the board file's name of the cgroup
    cgroup: str  # relative to the cgroup2 root
    qos_class: str
    yields: tuple[str, ...]
    journal: Journal
    restore_high: str | None  # memory.high to give back ("max"); None: the value before
    engine_pid: int | None = None  # governed: the published engine pid
    governed: bool = True
    usage: int = 0  # memory.current when listed
    # a llama-server router (its published state's router, issue 38): its url, and each
    # model's last request (epoch seconds) for the `unload` step's least recently used
    router_url: str | None = None
    router_last: dict[str, float | None] | None = None


Invalid = Callable[[str, str], None]  # (victim, reason): told once per problem by the shedder


def governed_groups(run: Path) -> list[str]:
    """The group of every published plan, live or stale: what a board entry may not be,
    contain or lie inside (governor/board/file.py)."""
    plans = (st.compiled() for st in read_states(run))
    return sorted({p.group for p in plans if p is not None and isinstance(p.group, str)})


def governed_victims(
    fs: CgroupFs, shedder: Plan, run: Path, invalid: Invalid | None = None
) -> list[Victim]:
    """The live governed slices of a lower class than ``shedder``'s (their published state).
    A state with an unknown class is no victim, an unknown step is not in its yields: each is
    told to ``invalid``, never mapped to an action."""
    rank = QOS_RANK[shedder.qos.qos_class]
    out = []
    states, unreadable = scan_states(run)
    for err in unreadable:  # not a state (its reader says why): no victim, one line
        if invalid is not None:
            invalid(err.path.parent.name, err.problem)
    for st in states:
        if st.stale or st.policy == shedder.policy or not st.plan:
            continue
        plan = st.compiled()
        if plan is None:
            continue
        cls, steps = plan.qos.qos_class, plan.qos.yields
        if cls not in QOS_RANK:
            if invalid is not None:
                invalid(plan.policy, f"unknown [qos] class {str(cls)[:40]!r}: not shed")
            continue
        if not isinstance(steps, (tuple, list)) or any(s not in SHED_STEPS for s in steps):
            if invalid is not None:
                invalid(plan.policy, f"unknown [qos] yield step in {str(steps)[:80]}: skipped")
            steps = tuple(s for s in SHED_STEPS if isinstance(steps, (tuple, list)) and s in steps)
        if QOS_RANK[cls] >= rank or not fs.exists(plan.group):
            continue
        if plan.cgroup_root != shedder.cgroup_root:
            continue
        high = next(
            (w.value for w in plan.writes if w.cgroup == plan.group and w.file == kf.MEMORY_HIGH),
            "max",
        )
        out.append(
            Victim(
                name=plan.policy,
                cgroup=plan.group,
                qos_class=cls,
                yields=tuple(steps),
                journal=Journal(run / plan.policy),
                restore_high=high,
                engine_pid=st.engine_pid,
                **_router(st),
            )
        )
    return out


def _router(st: RunState) -> dict[str, Any]:
    """The victim's router fields from its published state (RunState.router_models)."""
    found = st.router_models()
    return {} if found is None else {"router_url": found[0], "router_last": found[1]}


def board_victims(
    fs: CgroupFs, shedder: Plan, run: Path, entries: Sequence[BoardCgroup]
) -> list[Victim]:
    """The board file's cgroups of a lower class than ``shedder``'s that exist."""
    rank = QOS_RANK[shedder.qos.qos_class]
    return [
        Victim(
            name=b.name,
            cgroup=b.path,
            qos_class=b.qos_class,
            yields=b.yields,
            journal=Journal(run / BOARD_DIR / b.name),
            restore_high=None,
            governed=False,
        )
        for b in entries
        if QOS_RANK[b.qos_class] < rank and fs.exists(b.path)
    ]


def board_file_victims(
    fs: CgroupFs, shedder: Plan, run: Path, board: Path | None, invalid: Invalid
) -> list[Victim]:
    """The board file's valid entries (governor/board/file.py read_board) as victims; a bad
    one (`governor check` refuses it too), or one on a governed slice, is told to
    ``invalid`` and skipped, never shed on a guess, and hides none of the others."""
    read = read_board(board, [shedder.group, *governed_groups(run)])
    for err in read.errors:
        invalid(err.field or "-", str(err))
    out = []
    for entry in read.entries:
        try:
            out += board_victims(fs, shedder, run, [entry])
        except (GovernorError, ValueError, OSError) as err:
            invalid(entry.name, f"{entry.name}: {err}")
    return out


def own_process_cgroup() -> str | None:
    """This process's cgroup2 path (/proc/self/cgroup): a shedder never takes it, its
    ancestors or its descendants. None when /proc says none, or the root (every cgroup lies
    inside it: none is excluded for it)."""

    try:
        own = parse_proc_cgroup(ProcFs().self_cgroup())
    except (OSError, ValueError):
        return None
    return own or None
