"""The board's budget and the claims on it (issue 36): the pure admission arithmetic.

The board is one budget: MemTotal less a reserve (memory kept for the OS and the ungoverned
services: the board file's ``[board] reserve``, default :func:`reserve_for`). Every governed
slice, running (its published state) or installed (its unit and manifest), has a
:class:`Slice`: its ``memory.min`` (guaranteed) and its expected peak (the engine's estimate
where there is one, else ``memory.max``, else ``memory.high``); device memory a policy budgets
with ``[device]`` is held outside every cgroup and counts in the peak.

Two checks, both pure (:func:`admit`):

- **guarantees** never overcommit: the sum of every claim's memory.min and the new one's
  must stay within the budget, else the board cannot admit it;
- **peaks** may overcommit (a QoS pair is meant to share the board, the shed arbitrates): the
  new policy's ``[qos] admit`` says what happens when its peak does not fit beside the others'.

The verdict names the holders (the claims that hold the memory, largest first), the missing
bytes and the victims a ``shed`` admission would stop: running claims of a LOWER class only
(never equal or higher, ``QOS_RANK``), lowest class first, largest first, until enough is free.
A victim counts only when stopping its engine removes its claim (issue 43): an `apply` slice,
a `launch --keep` one and a `governor monitor`'s keep their state (and memory.min) after their
engine stops (``Slice.stays``), so they are never stopped, and the verdict names them.

Standard library only: plan/ is shared records, read at run time too (the launch path's
admission, the gatherer in governor/board/scan.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from governor.board.order import pick
from governor.board.slice import PeakSource, QosClass, Slice, SliceState
from governor.plan.model import SHED_STEPS, Plan
from governor.record import record, replace

MIB = 1 << 20
GIB = 1 << 30
RESERVE_BASE = 128 * MIB  # kernel, init, sshd, journald: what a headless board runs anyway
RESERVE_SHARE = 16  # plus 1/16 of the board: page tables, slab and cache grow with it
RESERVE_CAP = 1 * GIB

ADMIT_MODES = ("warn", "refuse", "wait", "shed")
AdmitMode = Literal["warn", "refuse", "wait", "shed"]
DEFAULT_ADMIT: AdmitMode = "warn"
DEFAULT_ADMIT_TIMEOUT_S = 60.0
VerdictKind = Literal["fits", "peaks", "guarantees"]


def reserve_for(memtotal: int) -> int:
    """The default reserve: 128 MiB + MemTotal/16, at most 1 GiB."""
    return min(RESERVE_CAP, RESERVE_BASE + memtotal // RESERVE_SHARE)


@record(frozen=True)
class Budget:
    """MemTotal, the reserve kept for the OS and ungoverned services, and what is left for the
    governed slices (never negative)."""

    memtotal: int
    reserve: int
    budget: int
    # board memory usable zram could free now (kernel/swap.py zram_room, issue 47): the peaks
    # may overlap by it, the guarantees never (memory.min is memory, not swap)
    zram_room: int = 0

    @classmethod
    def of(cls, memtotal: int, reserve: int | None = None) -> Budget:
        r = reserve_for(memtotal) if reserve is None else reserve
        return cls(memtotal=memtotal, reserve=r, budget=max(0, memtotal - r))


ZRAM_CLAIM = "[zram]"  # no policy name has brackets: never replaced by a policy's own claim


def zram_claim(mem_used_total: int) -> Slice | None:
    """zram's pool as a claim (issue 33): a slice's swapped pages compressed into memory that
    no cgroup is charged for. Held now, so it counts in both checks; never a shed victim (no
    class yields it, nothing to stop); None when zram holds nothing."""
    if mem_used_total <= 0:
        return None
    return Slice(
        name=ZRAM_CLAIM, cgroup="", qos=QosClass.INTERACTIVE, min=mem_used_total,
        peak=mem_used_total, peak_source="none", current=mem_used_total, yields=(),
        governed=False,
    )  # fmt: skip


def peak_of(
    estimate: int | None, memory_max: int | None, memory_high: int | None, floor: int = 0
) -> tuple[int, PeakSource]:
    """The expected peak and where it comes from: the estimate, else memory.max, else
    memory.high (None: "max" or unset), else ``floor`` (the min, or memory.current)."""
    for value, source in ((estimate, "estimate"), (memory_max, "max"), (memory_high, "high")):
        if value is not None and value > 0:
            return value, source  # type: ignore[return-value]  # the loop's literal
    return floor, "none"


@record(frozen=True)
class Verdict:
    """What admission says about one new claim beside the others."""

    kind: VerdictKind  # fits | peaks (the peaks overcommit) | guarantees (refused)
    claim: Slice  # the new one
    budget: Budget
    min_left: int  # guarantees left before the new claim (budget - others' guaranteed)
    peak_left: int  # peaks left before the new claim
    missing: int  # bytes the new claim lacks in the check that failed (0: fits)
    holders: tuple[Slice, ...]  # the other claims on the board, largest first (that check's)
    victims: tuple[Slice, ...]  # what a shed admission would stop (lower classes, running)
    enough: bool  # the victims free at least ``missing`` in both checks
    # lower-class claims a shed may not count: stopping their engine leaves their claim
    kept: tuple[Slice, ...] = ()
    # every other slice that can end (running, its claim leaves with its engine; zram's pool
    # shrinks with them) frees ``missing``: False, no wait can make room (issue 46 item 4)
    can_wait: bool = True
    need: tuple[int, int] = (0, 0)  # (guarantee bytes, peak bytes) missing: the shed's deficit

    @property
    def fits(self) -> bool:
        return self.kind == "fits"


def lower(new: Slice, others: tuple[Slice, ...]) -> list[Slice]:
    """The running slices of a lower class than ``new`` whose yield allows a stop."""
    return [
        c
        for c in others
        if c.state == "running" and c.qos.rank < new.qos.rank and ({"stop", "kill"} & set(c.yields))
    ]


def _can_end(c: Slice) -> bool:
    """Whether ``c``'s claim can leave the board by itself: a running engine whose stop frees
    it, or zram's pool (it shrinks as the slices that swapped exit); an installed slice, one
    whose claim stays, and a board file's cgroup hold theirs."""
    if c.name == ZRAM_CLAIM:
        return True
    return c.governed and c.state == "running" and not c.stays


def admit(budget: Budget, new: Slice, others: tuple[Slice, ...]) -> Verdict:
    """The pure admission check of ``new`` beside ``others`` (the new policy's own earlier
    claim, same name, is left out: a restart replaces it)."""
    others = tuple(c for c in others if c.name != new.name)
    min_left = budget.budget - sum(c.guaranteed for c in others)
    peak_left = budget.budget + budget.zram_room - sum(c.peak_claim for c in others)
    need_min = max(0, new.guaranteed - min_left)
    # an overlap is with the others' peaks: a peak above the budget on an empty board is the
    # policy's own sizing (check's estimate against memory.max), not an admission matter
    need_peak = min(max(0, new.peak_claim - peak_left), sum(c.peak_claim for c in others))
    kind: VerdictKind = "guarantees" if need_min else "peaks" if need_peak else "fits"
    victims: tuple[Slice, ...] = ()
    kept: tuple[Slice, ...] = ()
    enough = can_wait = True
    if kind != "fits":
        # the one victim order (board/order.py): lowest class, the coldest that alone covers
        # what is missing, else the largest; a slice whose claim stays is never chosen
        victims, enough = pick(lower(new, others), (need_min, need_peak))
        kept = tuple(c for c in lower(new, others) if c.stays)
        can_end = [c for c in others if _can_end(c)]
        can_wait = sum(c.guaranteed for c in can_end) >= need_min and (
            sum(c.peak_claim for c in can_end) >= need_peak
        )

    def key(c: Slice) -> int:
        return c.guaranteed if kind == "guarantees" else c.peak_claim

    holders = tuple(sorted((c for c in others if key(c) > 0), key=lambda c: (-key(c), c.name)))
    return Verdict(
        kind=kind,
        claim=new,
        budget=budget,
        min_left=min_left,
        peak_left=peak_left,
        missing=need_min if kind == "guarantees" else need_peak,
        holders=holders,
        victims=victims,
        enough=enough,
        kept=kept,
        can_wait=can_wait,
        need=(need_min, need_peak),
    )


def gib(n: int) -> str:
    """A size for admission's lines: "1.1 GiB" from 2 GiB on, whole MiB below ("566 MiB"): a
    tenth of a GiB (102 MiB) is too coarse for a small board's shortfall."""
    if abs(n) >= 2 * GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.0f} MiB"


def short(n: int) -> str:
    """A shortfall: as :func:`gib`, rounded up below 2 GiB (never "0 MiB short")."""
    if n >= 2 * GIB:
        return gib(n)
    return f"{-(-n // MIB)} MiB"


def no_budget_text(budget: Budget) -> str | None:
    """The reserve that leaves nothing for the governed slices ([board] reserve >= MemTotal),
    said as `check`, `board` and admission say it; None while there is a budget (or no
    MemTotal to weigh against)."""
    if budget.budget > 0 or budget.memtotal <= 0:
        return None
    return (
        f"the reserve ({budget.reserve / MIB:.0f} MiB) leaves no budget on this board"
        f" (MemTotal {budget.memtotal / MIB:.0f} MiB)"
    )


def holders_text(verdict: Verdict, limit: int = 3) -> str:
    """``npu-batch holds 1.1 GiB, tts holds 0.2 GiB``: who holds what the check counted (the
    reserve when it leaves no budget at all)."""
    guar = verdict.kind == "guarantees"
    parts = [
        f"{c.name} {'holds' if guar else 'claims'} {gib(c.guaranteed if guar else c.peak_claim)}"
        + ("" if c.state == "running" else f", {c.state}")
        for c in verdict.holders[:limit]
    ]
    if len(verdict.holders) > limit:
        parts.append(f"{len(verdict.holders) - limit} more")
    reserve = no_budget_text(verdict.budget)
    if reserve is not None:
        parts.insert(0, reserve)
    return "; ".join(parts) if parts else "no other slice"


def refusal_text(verdict: Verdict) -> str:
    """The one line of a refusal (without the ``governor:`` prefix and the coordinates)."""
    c = verdict.claim
    if verdict.kind == "guarantees":
        what = f"memory.min {gib(c.guaranteed)}, {gib(max(0, verdict.min_left))} of guarantees left"
    else:
        what = (
            f"peak {gib(c.peak_claim)} ({_source(c)}),"
            f" {gib(max(0, verdict.peak_left))} of peaks left"
        )
    return (
        f"the board cannot admit {c.name}: {what}, {short(verdict.missing)} short"
        f" ({holders_text(verdict)})"
    )


def kept_text(verdict: Verdict) -> str:
    """``; npu-batch's claim stays after a stop (apply)``: the lower classes a shed may not
    count (stopping their engine leaves their state and memory.min); "" when none."""
    return "".join(f"; {c.name}'s claim stays after a stop ({c.stays})" for c in verdict.kept)


def forced_text(verdict: Verdict) -> str:
    """The warning line of an admission by --force: the check that failed, in its own words."""
    if verdict.kind != "guarantees":
        return overlap_text(verdict)
    c = verdict.claim
    return (
        f"{c.name}'s memory.min {gib(c.guaranteed)} exceeds the guarantees left"
        f" ({gib(max(0, verdict.min_left))}) by {short(verdict.missing)}"
        f" ({holders_text(verdict)}): the guarantees overcommit the board"
    )


def _source(c: Slice) -> str:
    return "its memory.min" if c.peak_source == "none" else c.peak_text


def overlap_text(verdict: Verdict) -> str:
    """The one warning line of an admitted overlap (admit = "warn", or --force)."""
    c = verdict.claim
    above = [h.name for h in verdict.holders if h.qos.rank > c.qos.rank]
    if verdict.victims:
        who = f"; {c.name} would shed {', '.join(v.name for v in verdict.victims)}"
    elif above:
        who = f"; {', '.join(above)} would shed {c.name}"
    else:
        who = "; no class sheds the other"
    return (
        f"{c.name}'s peak {gib(c.peak_claim)} ({_source(c)}) overlaps the others' claims by"
        f" {short(verdict.missing)} ({holders_text(verdict)}){who}"
    )


def _size(value: object, what: str) -> int | None:
    """A limit as a plan writes it: bytes, or None for "max" (or a word that is no size).
    ValueError for a value no plan writes: negative, a bool, a float, not a number (a
    manifest or state another hand wrote: the claim is skipped, never weighed)."""
    if isinstance(value, str):
        word = value.split()[0] if value.split() else ""
        if word.isdigit():
            return int(word)
        if not word.startswith("-"):
            return None  # "max"
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"{what} {str(value)[:40]!r} is not a size a plan writes")


ABSURD = 16  # a claim above 16 x MemTotal is no policy for this board: a corrupt or foreign file


def claim_problem(c: Slice, memtotal: int) -> str | None:
    """Why a claim read from another process's file cannot be weighed (None: it can): a size
    far beyond this board. The types and signs :func:`claim_of_plan` refused already."""
    if memtotal <= 0:
        return None
    for what, n in (("memory.min", c.min), ("peak", c.peak), ("[device] memory", c.device)):
        if n > ABSURD * memtotal:
            return (
                f"{c.name}'s {what} {gib(n)} is more than {ABSURD} x this board's MemTotal"
                f" ({gib(memtotal)}): not weighed"
            )
    return None


def claim_of_plan(
    plan: Mapping[str, Any],
    *,
    estimate: int | None = None,
    state: SliceState = "running",
    current: int | None = None,
    **extra: Any,
) -> Slice:
    """The slice of a compiled plan as its dict (a published state's ``plan``, a manifest's
    claim): its group's memory.min, and the peak from ``estimate``, else its memory.max, else
    its memory.high; ``extra``: the slice's other fields (its liveness, journal, router).
    Raises ValueError for a dict that is not a plan (an unknown class included)."""
    try:
        group = plan["group"]
        limits = {
            w["file"]: _size(w["value"], w["file"])
            for w in plan["writes"]
            if w["cgroup"] == group and w["file"] in ("memory.min", "memory.max", "memory.high")
        }
        qos = plan.get("qos") or {}
        device = plan.get("device") or {}
        dev = device.get("memory")
        cls = QosClass.of(qos.get("qos_class", "standard"))
        if cls is None:
            raise ValueError(f"unknown [qos] class {str(qos.get('qos_class'))[:40]!r}")
        return _slice(
            str(plan["policy"]), str(group), cls=cls, limits=limits, estimate=estimate, current=current,
            state=state, device=0 if dev is None else _size(dev, "[device] memory") or 0,
            yields=tuple(qos.get("yields", SHED_STEPS)), **extra,
        )  # fmt: skip
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"not a compiled plan: {err!r}") from err


def slice_of_plan(
    plan: Plan,
    *,
    estimate: int | None = None,
    current: int | None = None,
    yields: tuple[str, ...] | None = None,
    measured: tuple[int, int] | None = None,
    **extra: Any,
) -> Slice:
    """The slice of a typed plan: the one admission is about to start, or a published state's
    (``current``, ``yields`` as checked, ``extra``: its liveness, journal, router): read from
    the :class:`Plan` itself, no dict in between. ``measured``: (peak, runs) its earlier runs
    measured (governor/state/peaks.py), claimed instead of the estimate."""
    memory = ("memory.min", "memory.max", "memory.high")
    limits = {
        w.file: _size(w.value, w.file)
        for w in plan.writes
        if w.cgroup == plan.group and w.file in memory
    }
    dev = None if plan.device is None else plan.device.memory
    extra.setdefault("state", "running")
    got = _slice(
        plan.policy, plan.group, cls=QosClass.of(plan.qos.qos_class) or QosClass.STANDARD,
        limits=limits, estimate=estimate, current=current,
        device=0 if dev is None else _size(dev, "device") or 0,
        yields=tuple(plan.qos.yields) if yields is None else yields, **extra,
    )  # fmt: skip
    if measured is None or measured[0] <= 0:
        return got
    peak, runs = measured
    return replace(got, peak=peak, peak_source="measured", peak_runs=runs)


def _slice(
    name: str,
    group: str,
    *,
    cls: QosClass,
    limits: Mapping[str, int | None],
    estimate: int | None,
    current: int | None,
    **fields: Any,
) -> Slice:
    mn = limits.get("memory.min") or 0
    peak, source = peak_of(
        estimate, limits.get("memory.max"), limits.get("memory.high"), max(mn, current or 0)
    )
    return Slice(
        name=name, cgroup=group, qos=cls, min=mn, peak=peak, peak_source=source,
        current=current, **fields,
    )  # fmt: skip


def plan_claim_dict(plan: Plan) -> dict[str, Any]:
    """The part of a compiled plan its claim reads (:func:`claim_of_plan`), cheaply (no
    ``to_dict()`` of the whole plan on the launch path); also what `install` records in its
    manifest so an installed-but-stopped service keeps its claim."""
    memory = ("memory.min", "memory.max", "memory.high")
    out: dict[str, Any] = {
        "policy": plan.policy,
        "group": plan.group,
        "writes": [
            {"cgroup": w.cgroup, "file": w.file, "value": w.value}
            for w in plan.writes
            if w.cgroup == plan.group and w.file in memory
        ],
        "qos": {"qos_class": plan.qos.qos_class, "yields": list(plan.qos.yields)},
    }
    if plan.device is not None:
        out["device"] = {"memory": plan.device.memory}
    return out
