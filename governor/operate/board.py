"""The board's claims as they are now (issue 36): the gatherer admission, `governor board`,
`status`, `top` and the metrics read.

- the budget: MemTotal (``<root>/proc/meminfo``) less the board file's ``[board] reserve``
  (default plan/budget.py ``reserve_for``);
- a **running** claim for every live published state (governor/rundir/state.py): its plan's
  memory.min and peak (the estimate it published, else memory.max, else memory.high) and its
  group's memory.current now;
- an **installed** claim for every policy `governor install` recorded
  (``<root>/etc/governor/installed/<name>.json``, governor/deploy/install.py) that does not
  run now: the claim the install wrote into its manifest.

Reads only: files another process wrote are checked, and one that is not what it should be is
skipped with its reason in ``problems`` (never a crash of the launch that reads them); a state's
claim and a manifest's go through the same checks (plan/budget.py claim_of_plan's sizes, then
claim_problem against this board's MemTotal).

A running claim records whether a stop of its engine removes it (``Claim.stays``): an `apply`
state has no process (its memory.min stays in the kernel), a `launch --keep` publishes its
group as applied when the engine ends, a `governor monitor` holds its state while the group
exists: an admission's shed never counts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from governor.errors import GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.parse import parse_max
from governor.kernel.procfs import ProcFs
from governor.kernel.swap import SwapReader
from governor.peer.files import read_capped
from governor.plan.board import board_path, read_board
from governor.plan.budget import (
    Budget,
    Claim,
    claim_of_plan,
    claim_problem,
    no_budget_text,
    zram_claim,
)
from governor.record import record, replace
from governor.rundir.state import RunState, scan_states

MANIFEST_DIR = "etc/governor/installed"  # governor/deploy/install.py MANIFEST_DIR
MANIFEST_MAX = 1 << 20  # deploy/install.py MANIFEST_MAX: a manifest over it is skipped


@record(frozen=True)
class BoardClaims:
    budget: Budget
    claims: tuple[Claim, ...]
    problems: tuple[str, ...] = ()  # states, manifests or a board file that were skipped
    # the reserve leaves no budget ([board] reserve >= MemTotal): the line that says so
    no_budget: str | None = None


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
    try:
        return parse_max(fs.read(group, "memory.current"))
    except (GovernorError, ValueError):
        return None


def running_claims(run: Path, fs: CgroupFs, proc: Path) -> tuple[list[Claim], list[str]]:
    """A claim per live published state (a stale one holds no engine: none)."""
    states, errors = scan_states(run, proc)
    problems = [f"{e.path}: {e.problem}" for e in errors]
    out: list[Claim] = []
    for st in states:
        if st.stale or not isinstance(st.plan, dict):
            continue
        model = st.model or {}
        total = model.get("total")
        estimate = total if isinstance(total, int) and not isinstance(total, bool) else None
        try:
            plan = st.plan
            out.append(
                claim_of_plan(
                    plan,
                    estimate=estimate,
                    state="running",
                    current=_current(fs, plan["group"]),
                    stays=stays(st),
                )
            )
        except (ValueError, KeyError, TypeError) as err:
            problems.append(f"{run / st.policy}: {err}")
    return out, problems


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


def installed_claims(root: Path, skip: set[str]) -> tuple[list[Claim], list[str]]:
    """A claim per installed policy not in ``skip`` (those that run: their running claim)."""
    directory = root / MANIFEST_DIR
    out: list[Claim] = []
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


def gather(
    *,
    run: Path | None,
    cgroup_root: Path,
    root: Path = Path("/"),
    board: Path | None = None,
    install_root: Path | None = None,
) -> BoardClaims:
    """Every claim on the board now, and its budget. ``root``: where /proc is (MemTotal);
    ``install_root``: where `install` recorded its manifests (default ``root``); ``run``: the
    run directory of the engines running now (None: a board rendered for elsewhere, none).
    zram's pool (memory charged to no slice) is a claim while it holds anything
    (plan/budget.py zram_claim)."""
    budget, problems = budget_of(root, board)
    fs = CgroupFs(cgroup_root)
    running, p1 = running_claims(run, fs, root / "proc") if run is not None else ([], [])
    running, p2 = weighable(running, budget.memtotal)
    installed, p3 = installed_claims(
        root if install_root is None else install_root, {c.name for c in running}
    )
    installed, p4 = weighable(installed, budget.memtotal)
    reader = SwapReader(root / "proc", root / "sys")
    swap = reader.read()
    budget = replace(budget, zram_room=swap.zram_room(reader.available()))
    zram = zram_claim(swap.zram_used)
    p5 = [f"{e} (its zram pool is left out of the claims)" for e in swap.zram_errors]
    claims = (*running, *installed, *([zram] if zram is not None else []))
    none = no_budget_text(budget)
    return BoardClaims(
        budget=budget,
        claims=claims,
        problems=(*problems, *p1, *p2, *p3, *p4, *p5),
        no_budget=None if none is None else f"{none} ([board] reserve, {board or board_path()})",
    )


def weighable(claims: list[Claim], memtotal: int) -> tuple[list[Claim], list[str]]:
    """The claims admission may weigh, and why each other one is skipped (plan/budget.py
    claim_problem: a size far beyond this board)."""
    out, problems = [], []
    for c in claims:
        problem = claim_problem(c, memtotal)
        if problem is None:
            out.append(c)
        else:
            problems.append(f"{c.name} ({c.state}): {problem}")
    return out, problems
