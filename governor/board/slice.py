"""One slice of the board (issue 44): what admission weighs, `governor board` renders, the shed
ladder takes memory from and the victim order (board/order.py) sorts, in ONE record.

A slice is a governed policy's cgroup (its published run state, or the manifest `governor
install` wrote), a board file's ungoverned cgroup, or zram's pool. Its **claim** on the budget
is its ``memory.min`` (guaranteed) and its expected peak (the peak its earlier runs measured,
else the engine's estimate, else
memory.max, else memory.high: ``peak_source``), plus ``[device]`` memory held outside every
cgroup. Its **liveness** says whether something runs in it now (``state``) and whether a stop
of that engine frees the claim (``stays`` names why it does not: an `apply` state, a `launch
--keep`, a `governor monitor`). Its **activity** (``active_at``) is what the order calls cold:
a router's latest request to any of its models, else the engine's start (a plain engine's
state records no request: its start is the last activity the run dir holds).

Standard library only: read at run time (the supervisor, the shedder) and by `governor board`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from governor.plan.model import SHED_STEPS
from governor.record import record

if TYPE_CHECKING:
    from governor.rundir.journal import Journal

PeakSource = Literal["measured", "estimate", "max", "high", "none"]
SliceState = Literal["running", "installed", "stopped"]


class QosClass(StrEnum):
    """A ``[qos] class``, lowest first; ``rank`` orders them (a shed only takes from a lower
    rank, never an equal or higher one)."""

    BACKGROUND = "background"
    STANDARD = "standard"
    INTERACTIVE = "interactive"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @classmethod
    def of(cls, text: object) -> QosClass | None:
        """The class a plan, state or board file spells; None for a word that is none."""
        return cls(text) if text in _NAMES else None


_NAMES = frozenset(c.value for c in QosClass)
_RANK = {QosClass.BACKGROUND: 0, QosClass.STANDARD: 1, QosClass.INTERACTIVE: 2}


@record(frozen=True)
class Slice:
    """One slice on the board (bytes; module docstring)."""

    name: str  # the policy's name, the board file's name of the cgroup, or "[zram]"
    cgroup: str  # relative to the cgroup2 root ("governor.slice/chat"); "" for zram
    qos: QosClass
    min: int = 0  # memory.min: guaranteed
    peak: int = 0  # the expected peak (see peak_source); at least min
    peak_source: PeakSource = "none"  # measured | estimate | max | high | none (min or current)
    peak_runs: int = 0  # measured: how many runs it is the highest of (governor/state/peaks.py)
    current: int | None = None  # memory.current now (None: not running, or unreadable)
    state: SliceState = "running"
    device: int = 0  # [device] memory, held outside every cgroup
    yields: tuple[str, ...] = SHED_STEPS  # what a shed may do to it ([qos] yield)
    # why its claim stays once its engine is stopped ("apply", "launch --keep", "governor
    # monitor": its state and memory.min outlive the engine); "": a stop frees it
    stays: str = ""
    governed: bool = True  # a policy's slice (False: a board file's cgroup, or zram)
    journal: Journal | None = None  # where a shed of it is journaled (None: not a victim)
    restore_high: str | None = None  # memory.high a shed gives back (None: the value before)
    engine_pid: int | None = None  # its published engine pid
    # a llama-server router (issue 38): its url and each model's last request (epoch s)
    router_url: str | None = None
    router_last: dict[str, float | None] | None = None
    active_at: float | None = None  # its last activity (epoch s; None: none known)
    # what bringing it back costs (s): its models' measured load seconds (issue 46; None: none)
    reload_s: float | None = None
    cgroup_root: str | None = None  # its plan's cgroup2 mount (None: this board's)
    # a router whose evictor keeps its loads under a budget ([engine] evict = "memory"): its
    # engine leaf (the router's own memory), each model's estimate (alias -> bytes), and who
    # lowered its budget now (rundir/cap.py: an admission's unload; None: nobody)
    evicts: bool = False
    leaf: str | None = None
    model_claims: dict[str, int] | None = None
    model_load_s: dict[str, float] | None = None  # alias -> its measured load seconds
    capped_by: str | None = None

    @property
    def qos_class(self) -> str:
        """The class as the plan and the renderings spell it."""
        return self.qos.value

    @property
    def guaranteed(self) -> int:
        """What the guarantees count: memory.min (device memory is no memcg protection, it
        counts in the peak)."""
        return self.min

    @property
    def peak_text(self) -> str:
        """Where the peak comes from, as renderings say it: ``measured, 3 runs``, ``estimate``."""
        if self.peak_source == "measured":
            return f"measured, {self.peak_runs} run{'s' * (self.peak_runs != 1)}"
        return self.peak_source

    @property
    def peak_claim(self) -> int:
        return max(self.peak, self.min) + self.device

    @property
    def usage(self) -> int:
        """memory.current now, 0 when unknown (what a throttle or a stop takes back)."""
        return self.current or 0


def activity(router_last: dict[str, float | None] | None, started_at: float | None) -> float | None:
    """A slice's last activity: a router's latest request to any model (none requested yet:
    its start), else its engine's start (module docstring)."""
    if router_last:
        seen = [t for t in router_last.values() if t is not None]
        if seen:
            return max(seen)
    return started_at
