"""The ONE victim order (issue 44 item 3): which lower-class slice goes first, for admission's
shed, the run-time shed ladder (monitor/actions/shedder.py) and any choice among slices.

- the lowest class first (background before standard before interactive);
- within a class, the slice **that alone covers the deficit at the least expected cost**
  (:func:`expected_cost`, issue 46 item 2: the seconds it takes to bring back, ``Slice.reload_s``,
  times the likelihood it is asked for again, from its last activity ``Slice.active_at``: a
  router's latest request, else its engine's start), else the largest (what it frees, then
  its name). The coldest cover (none known counts as coldest) goes unless another costs less
  than CHEAPER (a third) of it: a load measured twice differs (a cold page cache, a busy
  CPU), and such noise must not overturn recency. Without measured reload seconds every slice weighs the
  same, and the coldest that covers goes;
- a slice whose stop would not free its claim (``Slice.stays``) is never chosen to be stopped.

After each pick the deficit shrinks by what that slice frees, so the next pick covers what is
left; once nothing is missing every slice "covers", and the rest follow coldest first. Without
a known deficit (the ladder: a pressure rule fired, it names no bytes) no slice is known to
cover it, so each class goes largest first.

The router's evictor (supervise/evict.py) orders its idle models by the same figure
(:func:`by_value`): the same rule, one class, models for slices.

Pure: tests call it with a table of slices (tests/unit/board/test_order.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from governor.board.slice import Slice

Need = tuple[int, int]  # (guarantee bytes, peak bytes) missing
Frees = Callable[[Slice], Need]
T = TypeVar("T")
# one victim's reload seconds and last activity (epoch s); None: not known
Cost = Callable[[T], tuple[float | None, float | None]]

# the likelihood of reuse halves with every REUSE_HALF_LIFE_S of idleness: a model asked for a
# minute ago is likely asked again soon, one idle for an hour hardly (recency as LRU reads it,
# made a weight the reload seconds can be multiplied by)
REUSE_HALF_LIFE_S = 600.0
# a cover cheaper than the coldest goes first only below this share of the coldest's expected
# cost: two loads of one model file differ by less (a first load reads the file, a reload
# finds it in the page cache), a 300 MiB model against a 4 GiB one by far more
CHEAPER = 1 / 3
UNKNOWN_RELOAD_S = 1.0  # what a slice or model with no measured load weighs: all alike


def reuse(last: float | None, now: float) -> float:
    """The likelihood, 0..1, that something last active at ``last`` (epoch s; None: never)
    is asked for again soon: 1 now, halving every REUSE_HALF_LIFE_S of idleness."""
    if last is None:
        return 0.0
    return float(0.5 ** (max(0.0, now - last) / REUSE_HALF_LIFE_S))


def expected_cost(reload_s: float | None, last: float | None, now: float) -> float:
    """What giving it up is expected to cost, in seconds: its reload seconds (None: unknown,
    UNKNOWN_RELOAD_S) times its likelihood of reuse (:func:`reuse`)."""
    return (UNKNOWN_RELOAD_S if reload_s is None else reload_s) * reuse(last, now)


def by_value(
    items: Sequence[T],
    need: int,
    *,
    frees: Callable[[T], int],
    cost: Cost[T],
    now: float,
    name: Callable[[T], str] = str,
) -> list[T]:
    """``items`` (one class) in the order they give way for ``need`` bytes: the one that alone
    covers what is still missing at the least expected cost (``cost``: its reload seconds and
    last activity, :func:`expected_cost`; the coldest unless one costs less than CHEAPER of
    it), else the largest; after each, the deficit shrinks by what it frees."""
    left = list(items)
    out: list[T] = []
    want = need
    while left:
        covers = [x for x in left if frees(x) >= want]
        if covers:
            pick = cheapest(covers, cost, now, name)
        else:
            pick = min(left, key=lambda x: (-frees(x), _value(x, cost, now, name)))
        out.append(pick)
        left.remove(pick)
        want = max(0, want - frees(pick))
    return out


def cheapest(covers: list[T], cost: Cost[T], now: float, name: Callable[[T], str]) -> T:
    """Of ``covers``, the coldest, or one whose expected cost is below CHEAPER of its."""
    coldest = min(covers, key=lambda x: _cold(x, cost, name))
    best = min(covers, key=lambda x: _value(x, cost, now, name))
    limit = CHEAPER * _value(coldest, cost, now, name)[0]
    return best if _value(best, cost, now, name)[0] < limit else coldest


def _cold(x: T, cost: Cost[T], name: Callable[[T], str]) -> tuple[float, str]:
    last = cost(x)[1]
    return float("-inf") if last is None else last, name(x)


def _value(x: T, cost: Cost[T], now: float, name: Callable[[T], str]) -> tuple[float, float, str]:
    reload_s, last = cost(x)
    return (
        expected_cost(reload_s, last, now),
        float("-inf") if last is None else last,
        name(x),
    )


def claim_frees(s: Slice) -> Need:
    """What a stop frees in admission's two checks: its memory.min and its peak claim."""
    return s.guaranteed, s.peak_claim


def usage_frees(s: Slice) -> Need:
    """What a shed step takes back now: its memory.current (the ladder counts no claims)."""
    return 0, s.usage


def _covers(freed: Need, need: Need) -> bool:
    return freed[0] >= need[0] and freed[1] >= need[1]


def _now(slices: Iterable[Slice]) -> float:
    """The latest activity known: the ages :func:`reuse` weighs are relative to it."""
    return max((s.active_at for s in slices if s.active_at is not None), default=0.0)


def order(
    slices: Iterable[Slice],
    need: Need | None = None,
    *,
    frees: Frees = claim_frees,
    stop: bool = True,
    now: float | None = None,
) -> list[Slice]:
    """``slices`` in the order they give way (module docstring). ``need``: the deficit (None:
    unknown); ``frees``: what one slice gives back, in the deficit's bytes; ``stop``: the
    slices are to be stopped (one whose claim stays is left out; False: the ladder's milder
    steps, which take memory from it all the same); ``now``: the epoch the ages are counted
    to (None: the latest activity among them)."""
    left = [s for s in slices if not (stop and s.stays)]
    at = _now(left) if now is None else now

    def figure(x: Slice) -> tuple[float | None, float | None]:
        return x.reload_s, x.active_at

    out: list[Slice] = []
    want = need
    while left:
        rank = min(s.qos.rank for s in left)
        tier = [s for s in left if s.qos.rank == rank]
        covers = [] if want is None else [s for s in tier if _covers(frees(s), want)]
        if covers:
            pick = cheapest(covers, figure, at, lambda x: x.name)
        else:
            pick = min(tier, key=lambda s: (-frees(s)[1], -frees(s)[0], s.name))
        out.append(pick)
        left.remove(pick)
        if want is not None:
            got = frees(pick)
            want = (max(0, want[0] - got[0]), max(0, want[1] - got[1]))
    return out


def pick(
    slices: Iterable[Slice], need: Need, *, frees: Frees = claim_frees, now: float | None = None
) -> tuple[tuple[Slice, ...], bool]:
    """The slices to stop, in :func:`order`, until ``need`` is free; and whether they free
    enough (False: all of them do not)."""
    out: list[Slice] = []
    freed = (0, 0)
    for s in order(slices, need, frees=frees, now=now):
        if _covers(freed, need):
            break
        out.append(s)
        got = frees(s)
        freed = (freed[0] + got[0], freed[1] + got[1])
    return tuple(out), _covers(freed, need)
