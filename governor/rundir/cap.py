"""A router's lowered budget (issue 46): what makes an admission's unload count
(board/unload.py decides it, board/unloading.py applies it; a run-dir file,
like the state and the journal).

``<run dir>/<router policy>/cap.json``, written whole (governor/atomic.py) by the admitting
launch before it unloads anything::

    {"by": "chat", "pid": 1234, "pid_start": 98765, "budget": 858993459, "own": 25165824,
     "before": 1288490188, "models": ["m1", "m2"], "at": 1767000000.0}

- **held while its holder runs**: the admitted launch's process, named by its pid AND its start
  time as a published state is (rundir/liveness.py): the admitted tenant's claim is held by
  that process, from its admission until its engine ends;
- **read each time** by the router's evictor (supervise/evict.py ``budget``: the lower of its
  own budget and this one, so a load over it unloads an idle model or is refused, never
  grows the router; the router's own share, ``own``, follows its engine leaf's memory.current
  there: the budget bounds the models, a router whose own memory moves by a few KiB between
  two requests never has a model refused for it) and by the board scan (board/scan.py: the router's peak claim is at most
  this budget, so the admission's own re-read, ``status`` and the next admission see it);
- **given back** the moment its holder ends (a crash, a kill -9 included): a reader treats a
  cap whose holder is gone as absent, nobody has to remove it; the holder removes it itself
  when its admission fails after writing it (board/admission.py: nothing half-applied), and
  the next admission that lowers the router replaces a void one.

A file that is not one a governor writes (too big, not JSON, a wrong field, a FIFO, a symlink)
is no cap: ignored, never a crash of the evictor or the scan that reads it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.atomic import write_atomic
from governor.peer.files import read_capped
from governor.record import record
from governor.rundir.liveness import alive

if TYPE_CHECKING:
    from governor.plan.model import Plan

CAP_FILE = "cap.json"
CAP_MAX = 64 * 1024  # a cap with 64 model names fits in a few KiB


@record(frozen=True)
class Cap:
    """One lowered budget (module docstring)."""

    by: str  # the admitted tenant's policy
    pid: int  # its launch's process
    pid_start: int | None  # that process's start time (rundir/liveness.py)
    budget: int  # bytes the router's loads stay under
    own: int  # the router itself in ``budget`` (the models get ``budget - own``)
    before: int  # the router's peak claim before (bytes)
    models: tuple[str, ...]  # what the admission unloaded
    at: float  # when (epoch s)

    def to_json(self) -> dict[str, Any]:
        return {
            "by": self.by, "pid": self.pid, "pid_start": self.pid_start, "budget": self.budget,
            "own": self.own, "before": self.before, "models": list(self.models), "at": self.at,
        }  # fmt: skip


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def parse(text: bytes) -> Cap | None:
    """The cap a file holds, None when it is not one a governor writes."""
    try:
        d = json.loads(text)
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    models = d.get("models")
    ok = (
        isinstance(d.get("by"), str)
        and _int(d.get("pid"))
        and d["pid"] > 0
        and (d.get("pid_start") is None or _int(d.get("pid_start")))
        and _int(d.get("budget"))
        and _int(d.get("own"))
        and _int(d.get("before"))
        and isinstance(models, list)
        and all(isinstance(m, str) for m in models)
        and isinstance(d.get("at"), int | float)
        and not isinstance(d.get("at"), bool)
    )
    if not ok or not isinstance(models, list):
        return None
    return Cap(
        by=d["by"], pid=d["pid"], pid_start=d.get("pid_start"), budget=d["budget"],
        own=d["own"], before=d["before"], models=tuple(models), at=float(d["at"]),
    )  # fmt: skip


def read(directory: Path, proc: Path = Path("/proc")) -> Cap | None:
    """The router's cap that holds now (its holder runs), else None (module docstring)."""
    try:
        raw = read_capped(directory / CAP_FILE, CAP_MAX, follow=False)
    except OSError:
        return None
    cap = parse(raw)
    if cap is None or not alive(cap.pid, proc, start=cap.pid_start):
        return None
    return cap


def models_budget(directory: Path, proc: Path = Path("/proc")) -> int | None:
    """What the lowered budget that holds now leaves the models (bytes: ``budget - own``),
    None when none holds: the evictor's door."""
    cap = read(directory, proc)
    return None if cap is None else max(0, cap.budget - cap.own)


def models_budget_for(plan: Plan, run: Path, root: Path) -> int | None:
    """:func:`models_budget` of ``plan``'s router in the run dir ``run`` (``root``: where /proc
    is)."""
    return models_budget(run / plan.policy, root / "proc")


def held_for(plan: Plan, run: Path, root: Path) -> Cap | None:
    """:func:`read` of ``plan``'s router in the run dir ``run`` (``root``: where /proc is):
    supervise/caphigh.py's door."""
    return read(run / plan.policy, root / "proc")


def write(directory: Path, cap: Cap) -> None:
    """Lower the router's budget (whole or not at all; OSError passes)."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    write_atomic(directory / CAP_FILE, json.dumps(cap.to_json(), sort_keys=True) + "\n")


def remove(directory: Path, by: str, pid: int) -> bool:
    """Give the budget back: remove the cap when it is ``by``'s (its process ``pid``), never
    another tenant's; True when removed."""
    try:
        raw = read_capped(directory / CAP_FILE, CAP_MAX, follow=False)
    except OSError:
        return False
    cap = parse(raw)
    if cap is None or cap.by != by or cap.pid != pid:
        return False
    with contextlib.suppress(FileNotFoundError):
        (directory / CAP_FILE).unlink()
    return True
