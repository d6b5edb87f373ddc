"""The ONE victim order (issue 44 item 3): which lower-class slice goes first, for admission's
shed, the run-time shed ladder (monitor/actions/shedder.py) and any choice among slices.

- the lowest class first (background before standard before interactive);
- within a class, the **coldest** slice (its oldest last activity, ``Slice.active_at``: a
  router's latest request, else its engine's start; none known counts as coldest) **that alone
  covers the deficit**, else the largest (what it frees, then its name);
- a slice whose stop would not free its claim (``Slice.stays``) is never chosen to be stopped.

After each pick the deficit shrinks by what that slice frees, so the next pick covers what is
left; once nothing is missing every slice "covers", and the rest follow coldest first. Without
a known deficit (the ladder: a pressure rule fired, it names no bytes) no slice is known to
cover it, so each class goes largest first.

Pure: tests call it with a table of slices (tests/unit/board/test_order.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from governor.board.slice import Slice

Need = tuple[int, int]  # (guarantee bytes, peak bytes) missing
Frees = Callable[[Slice], Need]


def claim_frees(s: Slice) -> Need:
    """What a stop frees in admission's two checks: its memory.min and its peak claim."""
    return s.guaranteed, s.peak_claim


def usage_frees(s: Slice) -> Need:
    """What a shed step takes back now: its memory.current (the ladder counts no claims)."""
    return 0, s.usage


def _covers(freed: Need, need: Need) -> bool:
    return freed[0] >= need[0] and freed[1] >= need[1]


def _cold(s: Slice) -> tuple[float, str]:
    return (float("-inf") if s.active_at is None else s.active_at, s.name)


def order(
    slices: Iterable[Slice],
    need: Need | None = None,
    *,
    frees: Frees = claim_frees,
    stop: bool = True,
) -> list[Slice]:
    """``slices`` in the order they give way (module docstring). ``need``: the deficit (None:
    unknown); ``frees``: what one slice gives back, in the deficit's bytes; ``stop``: the
    slices are to be stopped (one whose claim stays is left out; False: the ladder's milder
    steps, which take memory from it all the same)."""
    left = [s for s in slices if not (stop and s.stays)]
    out: list[Slice] = []
    want = need
    while left:
        rank = min(s.qos.rank for s in left)
        tier = [s for s in left if s.qos.rank == rank]
        covers = [] if want is None else [s for s in tier if _covers(frees(s), want)]
        if covers:
            pick = min(covers, key=_cold)
        else:
            pick = min(tier, key=lambda s: (-frees(s)[1], -frees(s)[0], s.name))
        out.append(pick)
        left.remove(pick)
        if want is not None:
            got = frees(pick)
            want = (max(0, want[0] - got[0]), max(0, want[1] - got[1]))
    return out


def pick(
    slices: Iterable[Slice], need: Need, *, frees: Frees = claim_frees
) -> tuple[tuple[Slice, ...], bool]:
    """The slices to stop, in :func:`order`, until ``need`` is free; and whether they free
    enough (False: all of them do not)."""
    out: list[Slice] = []
    freed = (0, 0)
    for s in order(slices, need, frees=frees):
        if _covers(freed, need):
            break
        out.append(s)
        got = frees(s)
        freed = (freed[0] + got[0], freed[1] + got[1])
    return tuple(out), _covers(freed, need)
