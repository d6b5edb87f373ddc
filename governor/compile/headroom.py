"""The `board available < headroom` condition's compile (issue 36): the slice's claimed peak;
and `check`'s warning for a shed on PSI alone on a board without (enough) swap (issue 43)."""

from __future__ import annotations

from collections.abc import Sequence

from governor.errors import PolicyError
from governor.kernel import files as kf
from governor.plan.model import CgroupWrite, Plan, WatchCondition, WatchTrigger


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


# A PSI shed's lead time needs swap. PSI counts the time tasks stall in reclaim; a board whose
# anonymous memory has nowhere to go reclaims only page cache, and once that is spent the
# allocation goes to the OOM killer within the same reclaim pass (a few retries, milliseconds:
# mm/page_alloc.c should_reclaim_retry), before a 100 ms..1 s stall has built up in a trigger's
# window. The issue 43 scenario (2 GiB guest, no swap) saw the PSI-only shed's victim
# OOM-killed 2 runs of 2; with the headroom rule, 0. With swap the stall builds gradually (pages
# go out and fault back in) and the trigger fires in time, if the swap can take the overshoot:
# a quarter of MemTotal (Armbian's zram default is half, Raspberry Pi OS's swap file 100 MiB)
# is the line drawn here; a smaller swap fills within the stall and leaves the same cliff.
PSI_SHED_SWAP_SHARE = 4  # swap below MemTotal / 4: a shed on PSI alone comes too late
HEADROOM_RULE = 'when = "board available < headroom"'
# conditions that shed before the board is full: the headroom, or a MemAvailable floor
_AHEAD = frozenset({"headroom", "memavailable", "available"})


def psi_shed_warning(plan: Plan, swap_total: int | None, mem_total: int) -> str | None:
    """`check`'s warning for a policy that sheds on memory PSI only (no headroom or
    MemAvailable rule that sheds) on a board with less swap than a quarter of its memory
    (``swap_total``: /proc/meminfo's SwapTotal, None when it has none). None: nothing to say."""
    sheds = [w for w in plan.watch if any(a.verb == "shed" for a in w.actions)]
    psi = [
        w for w in sheds if isinstance(w.trigger, WatchTrigger) and w.trigger.resource == "memory"
    ]
    ahead = any(
        isinstance(w.trigger, WatchCondition) and w.trigger.condition in _AHEAD for w in sheds
    )
    swap = swap_total or 0
    if not psi or ahead or swap * PSI_SHED_SWAP_SHARE >= mem_total:
        return None
    rules = ", ".join(f"#{w.index} ({w.when})" for w in psi)
    rules = f"rule {rules} sheds" if len(psi) == 1 else f"rules {rules} shed"
    have = "unknown swap" if swap_total is None else f"{swap >> 20} MiB of swap"
    needs = "" if _peak(plan) else " (it needs [memory] max or high: the slice's peak)"
    return (
        f"{rules} on PSI alone, and this board has {have} (less than a quarter of its"
        f" {mem_total >> 20} MiB): the stall comes once the board is full, after the kernel's"
        f" OOM killer; shed before it: add a [[pressure]] rule with {HEADROOM_RULE} and"
        f' do = ["log", "shed"]{needs}'
    )


def _peak(plan: Plan) -> bool:
    return any(plan.limit(f) is not None for f in (kf.MEMORY_MAX, kf.MEMORY_HIGH))
