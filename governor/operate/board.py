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
skipped with its reason in ``problems`` (never a crash of the launch that reads them).
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
from governor.plan.board import read_board
from governor.plan.budget import Budget, Claim, claim_of_plan, zram_claim
from governor.record import record
from governor.rundir.state import scan_states

MANIFEST_DIR = "etc/governor/installed"  # governor/deploy/install.py MANIFEST_DIR
MANIFEST_MAX = 1 << 20  # deploy/install.py MANIFEST_MAX: a manifest over it is skipped


@record(frozen=True)
class BoardClaims:
    budget: Budget
    claims: tuple[Claim, ...]
    problems: tuple[str, ...] = ()  # states, manifests or a board file that were skipped


def memtotal(root: Path) -> int:
    """MemTotal of the host under ``root`` (bytes); 0 when unreadable."""
    try:
        return ProcFs(root / "proc").meminfo().get("MemTotal", 0)
    except (OSError, ValueError):
        return 0


def budget_of(root: Path, board: Path | None = None) -> tuple[Budget, tuple[str, ...]]:
    """The board's budget, and the board file's problem when its reserve cannot be read (the
    default reserve then holds; `governor check BOARD` refuses the file)."""
    read = read_board(board)
    problems = tuple(str(e) for e in read.errors if e.field == "board.reserve" or not e.field)
    return Budget.of(memtotal(root), read.reserve), problems


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
                    plan, estimate=estimate, state="running", current=_current(fs, plan["group"])
                )
            )
        except (ValueError, KeyError, TypeError) as err:
            problems.append(f"{run / st.policy}: {err}")
    return out, problems


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
    installed, p2 = installed_claims(
        root if install_root is None else install_root, {c.name for c in running}
    )
    swap = SwapReader(root / "proc", root / "sys").read()
    zram = zram_claim(swap.zram_used)
    p3 = [f"{e} (its zram pool is left out of the claims)" for e in swap.zram_errors]
    claims = (*running, *installed, *([zram] if zram is not None else []))
    return BoardClaims(budget=budget, claims=claims, problems=(*problems, *p1, *p2, *p3))
