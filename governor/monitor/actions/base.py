"""What every action handler shares: the firing's context, the result, the handler lifecycle.

A handler is made once per monitor for each handler class its plan's verbs name (registry.py)
and lives as long as the monitor: ``run`` at each firing of a rule that names one of its verbs,
``observe`` before the rules are evaluated (a handler may discount firings its own actions set
off), ``tick`` at each turn of the loop (timers, giving back), ``close`` once when the monitor
stops (nothing left frozen or held), ``totals`` for the published state. The loop calls these on
every handler alike: it never names a verb.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from governor.errors import GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.monitor.restart import Restarts
from governor.monitor.sources import Board
from governor.plan.model import Action, Plan
from governor.record import field, record
from governor.rundir.journal import Hold, Journal
from governor.rundir.liveness import alive


@record(frozen=True)
class Context:
    """What the action knows about why it runs (also the exec action's environment)."""

    rule: int
    when: str
    value: float | int | None = None
    active_s: float = 0.0

    def env(self, cgroup: str) -> dict[str, str]:
        return {
            "GOVERNOR_RULE": str(self.rule),
            "GOVERNOR_WHEN": self.when,
            "GOVERNOR_VALUE": "" if self.value is None else str(self.value),
            "GOVERNOR_ACTIVE_S": f"{self.active_s:.3f}",
            "GOVERNOR_CGROUP": cgroup,
        }


@record
class Result:
    action: str
    ok: bool
    before: Any = None
    after: Any = None
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


@record
class Ticked:
    """What a handler's ``tick`` did: its result, the ``when`` it is told under, and whether
    the published state's last actions show it (as a firing of rule -1)."""

    result: Result
    when: str
    publish: bool = False


@record
class Shared:
    """What the handlers of one monitor share and change: the one mutable part of :class:`Env`.

    ``pid``: the engine as the launcher tells the monitor (Monitor.engine_started; None before
    it starts and once it exited). The group's freeze, shared by freeze/thaw and the verbs
    that kill (kill thaws what we froze). ``execute`` runs another action as a firing would
    (logged the same way): set by the executor."""

    pid: int | None = None
    thaw_at: float | None = None  # pending automatic thaw
    frozen_by_us: bool = False
    execute: Callable[[Action, Context], Result] | None = None


@record(frozen=True)
class Env:
    """The collaborators every handler of one monitor sees, built once by whoever runs the
    monitor (the supervisor; `governor monitor`'s attach) and handed down whole: the monitor,
    its executor and each handler read this one record. ``shared`` is its mutable part."""

    fs: CgroupFs
    plan: Plan
    # the engine's processes (attach: the group's leaf); None: the pid the launcher told the
    # monitor (shared.pid)
    engine_pids: Callable[[], Sequence[int]] | None = None
    # board-wide readings under /proc (MemAvailable, PSI): the monitor's levels and how far a
    # shed's undo may grow a victim; None: the host's /proc (Monitor fills it in)
    board: Board | None = None
    clock: Callable[[], float] = time.monotonic
    run: Callable[..., Any] | None = None  # subprocess.run (imported when an exec runs)
    kill: Callable[[int, int], None] = os.kill
    page_size: int = os.sysconf("SC_PAGE_SIZE")
    # the launcher's relaunch budget (governor launch); None when attached (governor monitor)
    restarts: Restarts | None = None
    # the slice's change journal (governor/rundir/journal.py): set actions are journaled, and a
    # file the operator tuned keeps its value (absolute sets skip it; bounds follow the tune); a
    # shed that holds on the slice is its baseline (memory.high never above the throttle, no thaw)
    journal: Journal | None = None
    alive: Callable[[int | None], bool] = alive  # a shedder's pid still runs a governor
    watchdog: Any = None  # reverts what a handler holds should this process die
    shared: Shared = field(default_factory=Shared)

    @property
    def group(self) -> str:
        return self.plan.group

    def pids(self) -> list[int]:
        """The engine's processes now (an action's signal goes to each)."""
        if self.engine_pids is not None:
            return list(self.engine_pids())
        return [] if self.shared.pid is None else [self.shared.pid]

    def journal_locked(self) -> contextlib.AbstractContextManager[object]:
        """The slice journal's lock around read-baseline-write: a higher class's shed writes
        its step and journals it under the same lock, so a set never lifts a throttle whose
        entry it could not see yet (seen in the guest: 19 ms between the two). A journal
        that cannot be locked (an unwritable run dir) does not stop the action."""
        if self.journal is None:
            return contextlib.nullcontext()
        return self.journal.try_locked()

    def shed_hold(self) -> Hold | None:
        """The shed a higher class holds on this slice (its journal), None without one."""
        return self.journal.shed(self.alive) if self.journal is not None else None

    def live(self, file: str) -> int | None:
        return self.fs.read_limit(self.group, file)

    def procs(self) -> int:
        try:
            return sum(len(self.fs.procs(g)) for g in (self.group, self.plan.leaf))
        except GovernorError:
            return 0


class Handler:
    """The lifecycle every verb's handler has; the defaults do nothing."""

    def __init__(self, env: Env) -> None:
        self.env = env

    def run(self, action: Action, ctx: Context) -> Result:
        raise NotImplementedError

    def ends_firing(self, action: Action, res: Result) -> bool:
        """Whether the rule's later actions are skipped after this one (nothing is left)."""
        return False

    def observe(self, now: float, fired: set[int], *, sampled: bool) -> None:
        """Before the rules run: drop from ``fired`` the PSI firings this handler's own
        actions set off (``sampled``: a sample was just taken)."""

    def deadline(self) -> float | None:
        """When :meth:`tick` has something to do at the latest (a timer), or None."""
        return None

    def tick(self, now: float, quiet: Callable[[float], bool]) -> Ticked | None:
        """Once per loop turn. ``quiet(settle_s)``: every rule that runs this handler has been
        quiet for its cooldown (``settle_s`` without one)."""
        return None

    def close(self, why: str) -> None:
        """The monitor stops: give back whatever is held."""

    def totals(self) -> dict[str, list[dict[str, Any]]]:
        """Counters for the published state, by its field name."""
        return {}
