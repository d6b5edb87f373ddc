"""``[board] refaults > P%/W``: the thrash condition (issue 33), parsed. Pure.

File pages refaulted in the window (memory.stat ``workingset_refault_file``, in pages, times the
page size) as a share of the group's file pages (memory.stat ``file``); ``board refaults``: the
whole board's (/proc/vmstat and the file LRUs of /proc/meminfo). The failure PSI misses: a
model evicted and re-read (Android lmkd's ``ro.lmk.thrashing_limit`` acts on the same share).

``board file < model`` (issue 47): the board's file cache (the file LRUs of /proc/meminfo) is
below the engine's model size, so the model no longer fits in it, as after a thrash (lmkd keeps
shedding until the file cache is back above such a floor).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from governor.policy.durations import Duration, parse_duration
from governor.sizes import format_bytes

_REFAULT_RE = re.compile(
    r"^\s*(?P<board>board\s+)?refaults\s*>\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*%\s*/\s*(?P<window>\S+)\s*$"
)
# the share is the difference of two samples (1 s apart by default): a shorter window says nothing
REFAULT_WINDOW_MIN_US = 2_000_000
# the plan holds the share in hundredths of a percent (compile/thrash.py): a finer one would
# compile to 0 %, a rule that fires on any refault
REFAULT_PERCENT_MIN = Decimal("0.01")


@dataclass(frozen=True)
class RefaultCondition:
    percent: Decimal  # the share of the file pages, in percent (may exceed 100: re-read loops)
    window: Duration
    board: bool = False

    def __str__(self) -> str:
        return f"{'board ' if self.board else ''}refaults > {self.percent:f}%/{self.window}"


def parse_refaults(value: str) -> RefaultCondition:
    if not (m := _REFAULT_RE.match(value)):
        raise ValueError(
            f"cannot parse {value!r} (form: 'refaults > 50%/10s' or 'board refaults > 50%/10s')"
        )
    percent = Decimal(m["num"]).normalize()
    window = parse_duration(m["window"])
    if percent <= 0:
        raise ValueError(f"refault share must be positive in {value!r}")
    if percent < REFAULT_PERCENT_MIN:
        raise ValueError(
            f"refault share {percent:f}% is below the smallest the plan holds,"
            f" {REFAULT_PERCENT_MIN}%, in {value!r}"
        )
    if window.us < REFAULT_WINDOW_MIN_US:
        raise ValueError(f"refault window {window} is too short (at least 2s: two samples)")
    return RefaultCondition(percent, window, board=bool(m["board"]))


@dataclass(frozen=True)
class BoardFileCondition:
    below: int | None  # bytes; None: the model's size, resolved when the plan is compiled

    def __str__(self) -> str:
        return f"board file < {'model' if self.below is None else format_bytes(self.below)}"
