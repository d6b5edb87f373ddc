"""The `board available < headroom` condition's compile (issue 36): the slice's claimed peak."""

from __future__ import annotations

from collections.abc import Sequence

from governor.errors import PolicyError
from governor.kernel import files as kf
from governor.plan.model import CgroupWrite, WatchCondition


def headroom_condition(
    index: int, writes: Sequence[CgroupWrite], source: str | None
) -> WatchCondition:
    """``board available < headroom``: the slice's claimed peak as far as the plan knows it,
    memory.max else memory.high (at launch the engine's estimate replaces it, the way the
    board's claims count it); refused without either: the headroom would be unknown."""
    values = {w.file: w.value for w in writes}
    for file in (kf.MEMORY_MAX, kf.MEMORY_HIGH):
        if values.get(file, "max") != "max":
            return WatchCondition(
                condition="headroom", threshold=int(values[file]), file="/proc/meminfo"
            )
    raise PolicyError(
        "`board available < headroom` needs the slice's peak claim: memory.max or memory.high",
        file=source,
        field=f"pressure[{index}].when",
        hint="set [memory] max (the engine's peak) or high",
    )
