"""`governor board` (issue 36): one table for the whole board, from the claims the gatherer
(governor/board/scan.py) reads, the board's big ungoverned cgroups, and `--fits`.

The figures, in bytes (the JSON form; the table prints them in MiB):

- ``memtotal``, ``reserve`` (the board file's ``[board] reserve``, else the default),
  ``budget`` = memtotal - reserve (governor/board/budget.py);
- each governed slice (running: a live published state; installed: `governor install`'s
  manifest, its service stopped): class, ``min`` (memory.min + [device]), ``peak`` (the claim:
  the estimate, else memory.max, else memory.high) and where the peak comes from,
  memory.current;
- ``claimed``: the sums of min and peak; ``free``: budget less each (negative: the peaks
  overcommit, the shed arbitrates);
- ``ungoverned``: the top-level cgroups outside every governed slice (system.slice,
  user.slice, machine.slice, a container's) holding at least ``BIG`` bytes, and every board
  file entry, with memory.current.

Reads only; the figures are the kernel's files and the published states as they are now.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from governor.board.admission import shed_plan
from governor.board.budget import (
    ZRAM_CLAIM,
    Budget,
    Verdict,
    admit,
    gib,
    holders_text,
    no_budget_text,
    short,
)
from governor.board.file import GOVERNED_ROOT, BoardCgroup
from governor.board.slice import Slice
from governor.board.unload import Room, Shed, unload_rows, would_text
from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs

MIB = 1 << 20
BIG = 16 * MIB  # an ungoverned top-level cgroup below this is not worth a row
BOARD_FORMAT = 1


def current_of(fs: CgroupFs, cgroup: str) -> int | None:
    return fs.read_limit(cgroup, kf.MEMORY_CURRENT)


def ungoverned(
    fs: CgroupFs, claims: Sequence[Slice], entries: Sequence[BoardCgroup] = ()
) -> list[dict[str, Any]]:
    """The big top-level cgroups no policy governs, and the board file's entries (largest
    first): ``{"cgroup", "name", "class", "current"}``; class is the board file's (else None)."""
    tops = {GOVERNED_ROOT, *(c.cgroup.split("/", 1)[0] for c in claims)}
    rows: dict[str, dict[str, Any]] = {}
    try:
        children = fs.children("")
    except GovernorError:
        children = []
    for child in children:
        if child in tops:
            continue
        cur = current_of(fs, child)
        if cur is not None and cur >= BIG:
            rows[child] = {"cgroup": child, "name": child, "class": None, "current": cur}
    for e in entries:
        rows[e.path] = {
            "cgroup": e.path,
            "name": e.name,
            "class": e.qos_class,
            "current": current_of(fs, e.path),
        }
    return sorted(rows.values(), key=lambda r: (-(r["current"] or 0), r["cgroup"]))


def claim_row(c: Slice) -> dict[str, Any]:
    return {
        "name": c.name,
        "group": c.cgroup,
        "class": c.qos_class,
        "min": c.guaranteed,
        "peak": c.peak_claim,
        "peak_source": c.peak_source,
        **({"peak_runs": c.peak_runs} if c.peak_source == "measured" else {}),
        # a router whose budget a higher class's admission lowered (rundir/cap.py, issue 46)
        **({"lowered_by": c.capped_by} if c.capped_by else {}),
        "current": c.current,
        "state": c.state,
        "device": c.device,
    }


def view(
    budget: Budget,
    claims: Sequence[Slice],
    others: Sequence[dict[str, Any]] = (),
    problems: Sequence[str] = (),
    no_budget: str | None = None,
) -> dict[str, Any]:
    """The board as `governor board --json` prints it (format 1: fields are only added).
    ``no_budget``: the line of a reserve that leaves no budget (board/scan.py scan)."""
    order = {"running": 0, "installed": 1, "stopped": 2}
    rows = sorted(claims, key=lambda c: (order.get(c.state, 3), -c.peak_claim, c.name))
    claimed_min = sum(c.guaranteed for c in claims)
    claimed_peak = sum(c.peak_claim for c in claims)
    return {
        "format": BOARD_FORMAT,
        "memtotal": budget.memtotal,
        "reserve": budget.reserve,
        "budget": budget.budget,
        "claimed": {"min": claimed_min, "peak": claimed_peak},
        "free": {"guarantees": budget.budget - claimed_min, "peaks": budget.budget - claimed_peak},
        "zram_room": budget.zram_room,  # issue 47: the peaks may overlap by it (kernel/swap.py)
        "slices": [claim_row(c) for c in rows],
        "ungoverned": list(others),
        "problems": list(problems),
        "no_budget": no_budget,
    }


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:.0f} MiB"


def render(v: dict[str, Any]) -> str:
    """The table `governor board` prints."""
    lines = [
        f"board: MemTotal {_mib(v['memtotal'])}, reserve {_mib(v['reserve'])},"
        f" budget {_mib(v['budget'])}",
        f"claimed: {_mib(v['claimed']['min'])} guaranteed (min),"
        f" {_mib(v['claimed']['peak'])} at peak",
        f"free: {_mib(v['free']['guarantees'])} for guarantees,"
        f" {_mib(v['free']['peaks'])} for peaks",
    ]
    if v.get("zram_room"):
        lines.append(f"zram: peaks may overlap by {_mib(v['zram_room'])} more (usable zram)")
    if v.get("no_budget"):
        lines.append(f"NO BUDGET: {v['no_budget']}: nothing can be admitted")
    if v["slices"]:
        lines += ["", f"{'SLICE':<16} {'CLASS':<12} {'MIN':>9} {'PEAK':>20} {'CURRENT':>9}  STATE"]
        for s in v["slices"]:
            peak = f"{_mib(s['peak'])} ({peak_said(s)})"
            zram = s["name"] == ZRAM_CLAIM  # swap no cgroup is charged for (issue 33)
            lines.append(
                f"{s['name']:<16} {'-' if zram else s['class']:<12} {_mib(s['min']):>9}"
                f" {peak:>20} {_mib(s['current']):>9}  "
                + ("swapped pages, charged to no slice" if zram else s["state"])
            )
    else:
        lines += ["", "no governed slice"]
    if v["ungoverned"]:
        lines += ["", f"{'UNGOVERNED':<40} {'CLASS':<12} {'CURRENT':>9}"]
        for u in v["ungoverned"]:
            lines.append(f"{u['cgroup']:<40} {u['class'] or '-':<12} {_mib(u['current']):>9}")
    for p in v["problems"]:
        lines.append(f"skipped: {p}")
    return "\n".join(lines) + "\n"


def fits(
    budget: Budget,
    new: Slice,
    claims: Sequence[Slice],
    admit_mode: str,
    rooms: Callable[[list[Slice]], list[Room]] | None = None,
) -> dict[str, Any]:
    """`governor board --fits`: does ``new`` fit beside ``claims``, and what its launch would
    do under its ``[qos] admit`` (a shed: the lower-class routers' idle models it would unload,
    ``rooms`` giving what they hold now as admission reads it, and the victims it would
    stop; board/admission.py shed_plan, the decision the start makes)."""
    verdict: Verdict = admit(budget, new, tuple(claims))
    shed = None
    if admit_mode == "shed" and not verdict.fits:
        shed = shed_plan(new, verdict, tuple(claims), rooms)
    out: dict[str, Any] = {
        "policy": new.name,
        "fits": verdict.fits and budget.budget > 0,
        "check": verdict.kind,
        "admit": admit_mode,
        "min": new.guaranteed,
        "peak": new.peak_claim,
        "peak_source": new.peak_source,
        **({"peak_runs": new.peak_runs} if new.peak_source == "measured" else {}),
        "free": {"guarantees": verdict.min_left, "peaks": verdict.peak_left},
        "missing": verdict.missing,
        "holders": [c.name for c in verdict.holders],
        "victims": [c.name for c in (shed.stops if shed else verdict.victims)]
        if admit_mode == "shed"
        else [],
        "unloads": unload_rows(shed) if shed else [],
        "enough": shed.enough if shed else verdict.enough,
    }
    out["line"] = fits_line(verdict, admit_mode, shed)
    return out


def fits_line(verdict: Verdict, admit_mode: str, shed: Shed | None = None) -> str:
    c = verdict.claim
    if verdict.budget.budget <= 0:  # nothing is left to weigh against: say why, not "fits"
        why = no_budget_text(verdict.budget) or "no MemTotal was read"
        return f"no: the board's budget is 0 ({why}): nothing can be admitted"
    said = f" ({c.peak_text})" if c.peak_source == "measured" else ""
    if verdict.fits:
        return (
            f"yes: {c.name} fits (min {gib(c.guaranteed)} of {gib(verdict.min_left)} left,"
            f" peak {gib(c.peak_claim)}{said} of {gib(verdict.peak_left)} left)"
        )
    what = "guarantees" if verdict.kind == "guarantees" else "peaks"
    line = f"no: {c.name} lacks {short(verdict.missing)} of {what} ({holders_text(verdict)})"
    if admit_mode == "shed" and shed is not None and shed.unloads:
        return f'{line}; admit = "shed" would {would_text(shed)}'
    if admit_mode == "shed":
        names = ", ".join(v.name for v in verdict.victims) or "nothing"
        enough = "" if verdict.enough else ", not enough"
        return f'{line}; admit = "shed" would stop {names}{enough}'
    if verdict.kind == "peaks" and admit_mode == "warn":
        return f'{line}; admit = "warn" would start it with a warning'
    return f'{line}; admit = "{admit_mode}" would {_would(admit_mode)}'


def _would(mode: str) -> str:
    return {"refuse": "refuse it (75)", "wait": "wait for room", "warn": "refuse it (75)"}.get(
        mode, "refuse it (75)"
    )


def peak_said(row: dict[str, Any]) -> str:
    """A row's peak source: ``measured, 3 runs`` (governor/state/peaks.py), ``estimate``..."""
    lowered = f", lowered by {row['lowered_by']}" if row.get("lowered_by") else ""
    if row["peak_source"] != "measured":
        return f"{row['peak_source']}{lowered}"
    runs = row.get("peak_runs") or 0
    return f"measured, {runs} run{'s' * (runs != 1)}{lowered}"
