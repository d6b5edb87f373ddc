"""The ONE scan of the run dir and the board (issue 44): read once per decision into a
:class:`Board`, which admission, `governor board`, `status`, `top`, the metrics, the shed
ladder and the evictor all read (oomd's one context per interval: nobody rescans).

- the budget: MemTotal (``<root>/proc/meminfo``) less the board file's ``[board] reserve``
  (default board/budget.py ``reserve_for``);
- a **running** slice for every live published state (governor/rundir/state.py): its plan's
  memory.min and peak (the estimate it published, else memory.max, else memory.high), its
  group's memory.current now, its liveness (``Slice.stays``), journal, engine pid, router and
  last activity (board/slice.py);
- an **installed** slice for every policy `governor install` recorded
  (``<root>/etc/governor/installed/<name>.json``, governor/deploy/install.py) that does not
  run now: the claim the install wrote into its manifest;
- zram's pool as a claim while it holds anything (board/budget.py zram_claim);
- the board file's ungoverned cgroups (``Board.cgroups``: shed victims, never claims).

Reads only: files another process wrote are checked, and one that is not what it should be is
skipped with its reason in ``notes`` (never a crash of the launch that reads them); a state's
claim and a manifest's go through the same checks (board/budget.py claim_of_plan's sizes, then
claim_problem against this board's MemTotal).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from governor.board.budget import (
    Budget,
    claim_of_plan,
    claim_problem,
    no_budget_text,
    slice_of_plan,
    zram_claim,
)
from governor.board.file import BoardCgroup, board_path, read_board
from governor.board.slice import QosClass, Slice, activity
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.kernel.swap import SwapReader
from governor.peer.files import read_capped
from governor.plan.model import SHED_STEPS, Plan
from governor.record import record, replace
from governor.rundir import cap as caps
from governor.rundir.journal import Journal
from governor.rundir.state import RunState, scan_states

MANIFEST_DIR = "etc/governor/installed"  # governor/deploy/install.py MANIFEST_DIR
MANIFEST_MAX = 1 << 20  # deploy/install.py MANIFEST_MAX: a manifest over it is skipped
BOARD_DIR = "board"  # <run dir>/board/<name>/journal.jsonl: an ungoverned cgroup's journal


@record(frozen=True)
class Board:
    """The board as one decision reads it (module docstring)."""

    budget: Budget
    slices: tuple[Slice, ...]  # every claim: running, installed, zram
    notes: tuple[str, ...] = ()  # states, manifests or a board file that were skipped
    # the reserve leaves no budget ([board] reserve >= MemTotal): the line that says so
    no_budget: str | None = None
    cgroups: tuple[Slice, ...] = ()  # the board file's ungoverned cgroups (shed victims)
    # (who, why) of what a shed may not weigh: a state that is not one, a board entry
    invalid: tuple[tuple[str, str], ...] = ()
    file_invalid: tuple[tuple[str, str], ...] = ()
    governed: tuple[str, ...] = ()  # every published plan's group, live or stale

    def free_for(self, policy: str) -> int | None:
        """The budget left for ``policy`` beside every other slice's peak claim (the room
        ``[engine] evict = "memory"`` weighs, supervise/evict.py); None: no MemTotal to weigh
        against (a fixture root)."""
        if self.budget.memtotal <= 0:
            return None
        others = sum(c.peak_claim for c in self.slices if c.name != policy)
        return max(0, self.budget.budget - others)


def memtotal(root: Path) -> int:
    """MemTotal of the host under ``root`` (bytes); 0 when unreadable."""
    try:
        return ProcFs(root / "proc").meminfo().get("MemTotal", 0)
    except (OSError, ValueError):
        return 0


def budget_of(root: Path, board: Path | None = None) -> tuple[Budget, tuple[str, ...]]:
    """The board's budget, and the board file's problems with it, as `governor check BOARD`
    reports them: a file that cannot be read, a ``[board]`` key that is not one (an unknown
    key, a reserve that is no size: the default reserve then holds)."""
    read = read_board(board)
    problems = [str(e) for e in read.errors if not (e.field or "").startswith("cgroup")]
    return Budget.of(memtotal(root), read.reserve), tuple(problems)


def _current(fs: CgroupFs, group: str) -> int | None:
    return fs.read_limit(group, kf.MEMORY_CURRENT)


def _high(plan: Plan) -> str:
    """The memory.high the plan writes on its group (a shed gives it back), else "max"."""
    for w in plan.writes:
        if w.cgroup == plan.group and w.file == kf.MEMORY_HIGH and isinstance(w.value, str):
            return w.value
    return "max"


def _yields(plan: Plan, invalid: list[tuple[str, str]], name: str) -> tuple[str, ...]:
    steps = plan.qos.yields
    if any(s not in SHED_STEPS for s in steps):
        invalid.append((name, f"unknown [qos] yield step in {str(list(steps))[:80]}: skipped"))
        return tuple(s for s in SHED_STEPS if s in steps)
    return tuple(steps)


def running_slices(
    run: Path, fs: CgroupFs, proc: Path
) -> tuple[list[Slice], list[str], list[tuple[str, str]], list[str]]:
    """A slice per live published state (a stale one holds no engine: none); the notes, what a
    shed may not weigh, and every published plan's group (live or stale)."""
    states, errors = scan_states(run, proc)
    problems = [f"{e.path}: {e.problem}" for e in errors]
    invalid = [(e.path.parent.name, e.problem) for e in errors]
    groups = sorted({st.group for st in states if isinstance(st.group, str)})
    out: list[Slice] = []
    for st in states:
        plan = st.plan
        if st.stale or plan is None:
            continue
        model = st.model or {}
        total = model.get("total")
        estimate = total if isinstance(total, int) and not isinstance(total, bool) else None
        router = st.router_models()
        measured = _measured(model)
        cls = plan.qos.qos_class
        if QosClass.of(cls) is None:
            invalid.append((st.policy, f"unknown [qos] class {str(cls)[:40]!r}: not shed"))
            problems.append(f"{run / st.policy}: unknown [qos] class {str(cls)[:40]!r}")
            continue
        claims = model.get("router")
        lowered = caps.read(run / st.policy, proc) if router is not None else None
        try:
            got = (
                slice_of_plan(
                    plan, estimate=estimate, current=_current(fs, plan.group),
                    yields=_yields(plan, invalid, st.policy), stays=stays(st),
                    journal=Journal(run / st.policy), restore_high=_high(plan),
                    engine_pid=st.engine_pid,
                    router_url=None if router is None else router[0],
                    router_last=None if router is None else router[1],
                    active_at=activity(None if router is None else router[1], st.started_at),
                    reload_s=st.reload_s(), cgroup_root=st.cgroup_root, measured=measured,
                    evicts=plan.engine.evict == "memory", leaf=st.leaf,
                    model_claims=_model_claims(claims), model_load_s=_load_s(st),
                    capped_by=None if lowered is None else lowered.by,
                )
            )  # fmt: skip
            if lowered is not None:  # its evictor keeps its loads under the lowered budget
                got = replace(got, peak=min(got.peak, max(lowered.budget, got.min)))
            out.append(got)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            problems.append(f"{run / st.policy}: {err}")
    return out, problems, invalid, groups


def _model_claims(claims: Any) -> dict[str, int] | None:
    """alias -> bytes of a router state's estimate table (its "router" key), sizes only."""
    if not isinstance(claims, dict):
        return None
    return {
        a: v
        for a, v in claims.items()
        if isinstance(a, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
    }


def _load_s(st: RunState) -> dict[str, float] | None:
    """alias -> its measured load seconds, as a router state publishes them (issue 46)."""
    models = (st.router or {}).get("models") or {}
    out = {
        a: float(m["load_s"])
        for a, m in models.items()
        if isinstance(m, dict) and isinstance(m.get("load_s"), int | float)
    }
    return out or None


def _measured(model: dict[str, Any]) -> tuple[int, int] | None:
    """The (peak, runs) a state's model says its earlier runs measured (governor/state/peaks.py;
    published by the supervisor), None when it says none or something else."""
    peak, runs = model.get("measured"), model.get("measured_runs")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (peak, runs))
    return (peak, runs) if ok else None  # type: ignore[return-value]  # checked just above


def stays(st: RunState) -> str:
    """Why ``st``'s claim outlives a stop of its engine ("" when the stop frees it): an
    `apply` state (no process: its state and memory.min stay; "launch --keep" for the group a
    kept launch left), a launch with --keep (its group is published as applied when the engine
    ends), a `governor monitor` (it holds the state while the group exists)."""
    if st.source == "apply":
        return st.kept_by or "apply"
    if st.source == "monitor":
        return "governor monitor"
    return st.kept_by or ""


def installed_slices(root: Path, skip: set[str]) -> tuple[list[Slice], list[str]]:
    """A slice per installed policy not in ``skip`` (those that run: their running slice)."""
    directory = root / MANIFEST_DIR
    out: list[Slice] = []
    problems: list[str] = []
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return out, problems
    for path in files:
        if path.stem in skip:
            continue
        try:
            raw = read_capped(path, MANIFEST_MAX, follow=False)
        except OSError as err:  # gone since the glob; a FIFO, a device, a symlink, too big
            problems.append(f"{path}: {err.strerror}")
            continue
        try:
            data: Any = json.loads(raw)
            claim = data.get("claim") if isinstance(data, dict) else None
            if claim is None:
                continue  # installed before issue 36: no claim recorded (install again)
            out.append(claim_of_plan(claim, state="installed"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            problems.append(f"{path}: {err}")
    return out, problems


def board_cgroup(entry: BoardCgroup, run: Path) -> Slice:
    """A board file's ungoverned cgroup as a slice a shed may take from (no claim)."""
    return Slice(
        name=entry.name, cgroup=entry.path, qos=QosClass(entry.qos_class), yields=entry.yields,
        journal=Journal(run / BOARD_DIR / entry.name), governed=False,
    )  # fmt: skip


def scan(
    *,
    run: Path | None,
    cgroup_root: Path,
    root: Path = Path("/"),
    board: Path | None = None,
    install_root: Path | None = None,
    own: tuple[str, ...] = (),
    fs: CgroupFs | None = None,
) -> Board:
    """The board now: its budget, every claim, the board file's cgroups. ``root``: where /proc
    is (MemTotal); ``install_root``: where `install` recorded its manifests (default
    ``root``); ``run``: the run directory of the engines running now (None: a board rendered
    for elsewhere, none); ``own``: groups no board entry may be (a shedder's own); ``fs``: the
    cgroup fs to read (default one at ``cgroup_root``)."""
    fs = CgroupFs(cgroup_root) if fs is None else fs
    running, p1, invalid, governed = (
        running_slices(run, fs, root / "proc") if run is not None else ([], [], [], [])
    )
    read = read_board(board, [*own, *governed])
    budget = Budget.of(memtotal(root), read.reserve)
    problems = [str(e) for e in read.errors if not (e.field or "").startswith("cgroup")]
    cgroups = tuple(board_cgroup(e, run) for e in read.entries) if run is not None else ()
    running, p2 = weighable(running, budget.memtotal)
    installed, p3 = installed_slices(
        root if install_root is None else install_root, {c.name for c in running}
    )
    installed, p4 = weighable(installed, budget.memtotal)
    reader = SwapReader(root / "proc", root / "sys")
    swap = reader.read()
    budget = replace(budget, zram_room=swap.zram_room(reader.available()))
    zram = zram_claim(swap.zram_used)
    p5 = [f"{e} (its zram pool is left out of the claims)" for e in swap.zram_errors]
    none = no_budget_text(budget)
    return Board(
        budget=budget,
        slices=(*running, *installed, *([zram] if zram is not None else [])),
        notes=(*problems, *p1, *p2, *p3, *p4, *p5),
        no_budget=None if none is None else f"{none} ([board] reserve, {board or board_path()})",
        cgroups=cgroups,
        invalid=tuple(invalid),
        file_invalid=tuple((e.field or "-", str(e)) for e in read.errors),
        governed=tuple(governed),
    )


def free_for(plan: Plan, run: Path, root: Path = Path("/")) -> int | None:
    """The board's free budget for ``plan``'s slice now: one scan, the budget less every
    other slice's peak claim (what admission counts). The evictor of a router under
    ``[engine] evict = "memory"`` reads it when its group has no memory.max
    (supervise/evict.py; the supervisor hands it over); None: no MemTotal to weigh against."""
    return scan(run=run, cgroup_root=Path(plan.cgroup_root), root=root).free_for(plan.policy)


def weighable(claims: list[Slice], memtotal: int) -> tuple[list[Slice], list[str]]:
    """The claims admission may weigh, and why each other one is skipped (board/budget.py
    claim_problem: a size far beyond this board)."""
    out, problems = [], []
    for c in claims:
        problem = claim_problem(c, memtotal)
        if problem is None:
            out.append(c)
        else:
            problems.append(f"{c.name} ({c.state}): {problem}")
    return out, problems
