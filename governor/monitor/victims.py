"""Who a `shed` may take memory from (issue 23, governor/monitor/shed.py): the other governed
slices whose published run state (governor/rundir/state.py) is live and whose plan's ``[qos]
class`` ranks below the shedder's, and the board file's ungoverned cgroups
(governor/plan/board.py) of a lower class."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.plan.board import BoardCgroup
from governor.plan.model import QOS_RANK, Plan
from governor.record import record
from governor.rundir.journal import Journal
from governor.rundir.state import read_states

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


def governed_victims(fs: CgroupFs, shedder: Plan, run: Path) -> list[Victim]:
    """The live governed slices of a lower class than ``shedder``'s (their published state)."""
    rank = QOS_RANK[shedder.qos.qos_class]
    out = []
    for st in read_states(run):
        if st.get("stale") or st.get("policy") == shedder.policy or not st.get("plan"):
            continue
        try:
            plan = Plan.from_dict(st["plan"])
        except ValueError:
            continue
        if QOS_RANK[plan.qos.qos_class] >= rank or not fs.exists(plan.group):
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
                qos_class=plan.qos.qos_class,
                yields=plan.qos.yields,
                journal=Journal(run / plan.policy),
                restore_high=high,
                engine_pid=st.get("engine_pid"),
            )
        )
    return out


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
