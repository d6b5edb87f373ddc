"""The thrash condition compiled (issue 33): ``[board] refaults > P%/W`` as the monitor reads
it (monitor/thrash.py), and back to the policy's spelling. Pure."""

from __future__ import annotations

from decimal import Decimal

from governor.kernel import files as kf
from governor.plan.model import WatchCondition
from governor.policy.durations import Duration
from governor.policy.refaults import RefaultCondition


def refault_watch(when: RefaultCondition) -> WatchCondition:
    """The share in 1/100 % ("12.5%" stays exact in an int); the group's counters are in
    memory.stat, the board's in /proc/vmstat."""
    return WatchCondition(
        condition="board_refaults" if when.board else "refaults",
        threshold=int((when.percent * 100).to_integral_value()),
        window_s=when.window.seconds,
        file="/proc/vmstat" if when.board else kf.MEMORY_STAT,
    )


def refault_text(t: WatchCondition) -> str:
    window = Duration(int((t.window_s or 0) * 1e6))
    board = "board " if t.condition == "board_refaults" else ""
    return f"{board}refaults > {Decimal(t.threshold) / 100:f}%/{window}"
