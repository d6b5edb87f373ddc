"""Admission's ``shed`` unloads a lower-class router's idle models before it stops anyone
(issue 46, its leftover "admission's shed never uses unload"): the decision, pure.

A llama-server router under ``[engine] evict = "memory"`` has a claim that splits (:class:`Room`):

    the router itself (its engine leaf's memory.current)
  + its busy models (loaded, a request in flight, or their slots unreadable)
  + its idle loaded models (each with its estimate, else its leaf's memory.max or current:
    the figure its evictor counts, supervise/evict.py claim)

An unload alone frees nothing admission may count: the router loads the model again at the
next request. So an unload counts only together with a **lowered budget** (rundir/cap.py): the
router's evictor keeps its loads under ``own + busy + the idle models kept`` for as long as
the admitted tenant runs, refusing or unloading rather than growing. What that frees is the
router's peak claim less that budget (never below its memory.min: unloading frees no
guarantee, so a deficit of guarantees is never covered by unloads).

:func:`plan` decides, before anything is unloaded or stopped:

1. the idle models of the lower-class routers, lowest class first, in the value order the
   evictor uses (board/order.py by_value: the one that alone covers what is missing at the
   least expected cost, else the largest), until what their routers' lowered budgets free
   covers the peak deficit: **unload covers**;
2. else those unloads and, for what they leave missing, the stops board/order.py pick chooses
   among the other lower-class slices (a router being unloaded is not stopped as well):
   **unload + stop**;
   A model whose unload frees nothing more (its router is down to its memory.min) stays
   loaded.
3. else the stops alone, as before this module (a stop frees a guarantee, an unload none);
4. else **nothing covers**: admission refuses at once (75), before anyone is touched.

A router already lowered by another admission (``Slice.capped_by``) offers no unload: its
budget is held for that tenant (it can still be stopped).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from governor.board.budget import gib
from governor.board.order import Need, by_value, claim_frees, pick
from governor.board.slice import Slice
from governor.record import record


@record(frozen=True)
class Model:
    """One idle loaded model of a router: its claim (bytes) and what it costs to bring back."""

    alias: str
    size: int
    reload_s: float | None = None  # its measured load seconds (None: not measured)
    last: float | None = None  # its last request (epoch s; None: none known)


@record(frozen=True)
class Room:
    """A lower-class router's claim, split (module docstring)."""

    router: Slice
    own: int  # the router itself
    busy: int  # its models that are not idle, summed
    idle: tuple[Model, ...] = ()

    def budget(self, unloaded: Iterable[str]) -> int:
        """Its lowered budget once ``unloaded`` are gone: itself, its busy models and the idle
        models it keeps."""
        gone = set(unloaded)
        return self.own + self.busy + sum(m.size for m in self.idle if m.alias not in gone)

    def frees(self, unloaded: Iterable[str]) -> int:
        """What its claim gives back with that budget held: its peak claim less the lowered
        one (never below its memory.min); nothing while nothing is unloaded."""
        gone = tuple(unloaded)
        if not gone:
            return 0
        r = self.router
        return max(0, max(r.peak, r.min) - max(r.min, self.budget(gone)))


@record(frozen=True)
class Unload:
    """One router's part of a shed admission: the models to unload and its lowered budget."""

    router: Slice
    models: tuple[str, ...]
    before: int  # its peak before (bytes; [device] memory, which stays, left out)
    budget: int  # the budget its evictor keeps its loads under until the tenant ends
    own: int  # the router itself in it (its evictor weighs the models against the rest)
    frees: int  # what the admission counts


@record(frozen=True)
class Shed:
    """What a ``shed`` admission does, in order: the unloads, then the stops."""

    unloads: tuple[Unload, ...]
    stops: tuple[Slice, ...]
    enough: bool  # they free the whole deficit (False: refused at once, nothing touched)


def _unloads(need_peak: int, rooms: Sequence[Room], now: float) -> list[Unload]:
    """Idle models by class and value until their routers' lowered budgets free ``need_peak``
    (all of them when they never do)."""
    chosen: dict[str, list[str]] = {r.router.name: [] for r in rooms}

    def freed() -> int:
        return sum(r.frees(chosen[r.router.name]) for r in rooms)

    for rank in sorted({r.router.qos.rank for r in rooms}):
        items = [(r, m) for r in rooms if r.router.qos.rank == rank for m in r.idle]
        ordered = by_value(
            items, max(0, need_peak - freed()), frees=lambda x: x[1].size,
            cost=lambda x: (x[1].reload_s, x[1].last), now=now,
            name=lambda x: f"{x[0].router.name}/{x[1].alias}",
        )  # fmt: skip
        for room, model in ordered:
            got = freed()
            if got >= need_peak:
                break
            chosen[room.router.name].append(model.alias)
            if freed() == got:  # its router is down to its memory.min: it frees nothing more
                chosen[room.router.name].pop()
    return [
        Unload(
            router=r.router,
            models=tuple(chosen[r.router.name]),
            before=max(r.router.peak, r.router.min),
            budget=r.budget(chosen[r.router.name]),
            own=r.own,
            frees=r.frees(chosen[r.router.name]),
        )
        for r in rooms
        if chosen[r.router.name]
    ]


def plan(
    need: Need,
    stoppable: Sequence[Slice],
    rooms: Sequence[Room],
    *,
    now: float | None = None,
) -> Shed:
    """The shed of a ``need`` (guarantee bytes, peak bytes) deficit (module docstring):
    ``stoppable``, the lower-class slices a stop may take (budget.py lower); ``rooms``, the
    lower-class routers whose evictor can hold a lowered budget; ``now``: the epoch the
    models' ages count to (None: the latest request among them)."""
    need_min, need_peak = need
    rooms = [r for r in rooms if r.idle and r.router.capped_by is None]
    if need_min == 0 and need_peak > 0 and rooms:
        lasts = [m.last for r in rooms for m in r.idle if m.last is not None]
        at = (max(lasts) if lasts else 0.0) if now is None else now
        unloads = _unloads(need_peak, rooms, at)
        freed = sum(u.frees for u in unloads)
        if freed >= need_peak:
            return Shed(tuple(unloads), (), True)
        if unloads:
            taken = {u.router.name for u in unloads}
            rest = [s for s in stoppable if s.name not in taken]
            stops, enough = pick(rest, (0, need_peak - freed), frees=claim_frees)
            if enough:
                return Shed(tuple(unloads), stops, True)
    stops, enough = pick(stoppable, need, frees=claim_frees)
    return Shed((), stops, enough)


def would_text(shed: Shed) -> str:
    """What a shed would do, said before it does (`check`, `install`, `board --fits`):
    ``unload a, b from router r (frees 500 MiB: r's budget 1200 MiB -> 700 MiB) and stop
    batch``; ``stop nothing`` when it does nothing; ``, not enough`` when it frees too
    little."""
    parts = [
        f"unload {', '.join(u.models)} from router {u.router.name} (frees {gib(u.frees)}:"
        f" {u.router.name}'s budget {gib(u.before)} -> {gib(u.budget)})"
        for u in shed.unloads
    ]
    if shed.stops or not parts:
        parts.append(f"stop {', '.join(v.name for v in shed.stops) or 'nothing'}")
    return " and ".join(parts) + ("" if shed.enough else ", not enough")


def unload_rows(shed: Shed) -> list[dict[str, object]]:
    """The unloads of a shed as `board --fits --json` gives them (bytes)."""
    return [
        {"router": u.router.name, "models": list(u.models), "frees": u.frees,
         "before": u.before, "budget": u.budget}
        for u in shed.unloads
    ]  # fmt: skip
