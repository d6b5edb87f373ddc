"""What each model of llama-server's router costs to bring back (issue 46 item 1): its **load
seconds**, from its child's start to its first answer, and the **bytes** its leaf holds then,
recorded per model identity (state/costs.py) and published with the models (RunState.router:
``status`` and ``governor_model_load_seconds``).

A child's start is its placement into its leaf (supervise/models.py: within POLL_S of its
exec), or its thaw when it entered frozen (the wait for room is the evictor's, not the
model's). Its first answer is the router listing it ``loaded`` (GET /models,
peer/router.py): the router marks a child loaded once the child answers it
(tools/server/server-models.cpp), so the time is the client's wait for a cold model. The
router is asked only while a load is pending, at most every POLL_S, each call within the
client's deadline. A load the router reports stopped (``unloaded``, ``failed``) is no
measurement, nor one that took more than state/costs.py's MAX_LOAD_S.

The evictor (supervise/evict.py) reads :meth:`Loads.reload_s`: what is measured in this run,
else what an earlier run recorded for the same model file. Two models (aliases) of one file
cost the same to bring back, so they weigh alike: the file's latest load in this run, whichever
alias it was (a CI guest run timed three aliases of one file at 3.1-10.6 s under TCG, and the
evictor, which prefers a model three times cheaper to reload over the least recently used one,
unloaded the model used last: board/order.py CHEAPER).

Standard library only (the run time's import set).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import LeafNameError, model_cgroup
from governor.log import get_logger
from governor.peer.router import RouterClient, RouterError
from governor.plan.llama_args import last_value
from governor.state.costs import MAX_LOAD_S, Cost, CostBook, identity

log = get_logger(__name__)

POLL_S = 0.25  # between two GET /models while a load is pending
MODEL_OPTS = ("-m", "--model")  # llama-server's model path (common/arg.cpp)
LOADING = frozenset({"loading"})  # the router's status while its child has not answered yet
ANSWERED = frozenset({"loaded", "sleeping"})


def child_model(cmdline: bytes, cwd: Path | None = None) -> Path | None:
    """The --model path of a router child from its /proc/<pid>/cmdline (pure; a relative path
    taken from ``cwd``); None when it names none. The last one given wins, as in llama.cpp."""
    found = last_value(cmdline, MODEL_OPTS)
    if not found:
        return None
    path = Path(found)
    return path if path.is_absolute() or cwd is None else cwd / path


class Loads:
    """Each model's load, timed from :meth:`start` (or :meth:`restart`) to the router's first
    ``loaded`` (module docstring); :meth:`check` is one look, made by the router thread."""

    def __init__(
        self,
        fs: CgroupFs,
        group: str,
        *,
        client: RouterClient,
        book: CostBook,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        poll_s: float = POLL_S,
        on_loaded: Callable[[str], None] | None = None,
    ) -> None:
        self.fs = fs
        self.on_loaded = on_loaded  # the model answered: its activity's last request is now
        self.group = group
        self.client = client
        self.book = book
        self.clock = clock
        self.wall = wall
        self.poll_s = poll_s
        self.pending: dict[str, tuple[float, str | None]] = {}  # alias -> (start, identity)
        self.costs: dict[str, Cost] = {}  # alias -> measured now, else recorded before
        self.keys: dict[str, str] = {}  # alias -> its model file's identity
        self.by_key: dict[str, Cost] = {}  # identity -> its latest load measured in this run
        self._asked: float | None = None

    def start(self, alias: str, model: Path | None) -> None:
        """``alias``'s child was placed now (``model``: its file, the identity it is kept
        under); what an earlier run measured for that file stands until this load answers."""
        key = identity(model) if model is not None else None
        self.pending[alias] = (self.clock(), key)
        if key is not None:
            self.keys[alias] = key
        if key is not None and alias not in self.costs:
            known = self.book.get(key)
            if known is not None:
                self.costs[alias] = known

    def restart(self, alias: str) -> None:
        """``alias`` was thawed now: its load starts now (the wait for room is not its own)."""
        if alias in self.pending:
            self.pending[alias] = (self.clock(), self.pending[alias][1])

    def reload_s(self, alias: str) -> float | None:
        """``alias``'s reload seconds: its file's latest load in this run (any alias of it),
        else its own, else what an earlier run recorded for its file; None: not known."""
        key = self.keys.get(alias)
        cost = self.by_key.get(key) if key is not None else None
        if cost is None:
            cost = self.costs.get(alias)
        return None if cost is None else cost.load_s

    def check(self) -> bool:
        """Ask the router (at most every ``poll_s``, only while a load is pending) which of
        the pending models answered; True when a load was measured."""
        if not self.pending:
            return False
        now = self.clock()
        if self._asked is not None and now - self._asked < self.poll_s:
            return False
        self._asked = now
        try:
            statuses = self.client.models()
        except RouterError as err:
            log.debug("loads.router_unreadable", error=str(err))
            return False
        measured = False
        for alias, pending in list(self.pending.items()):
            started, key = pending
            status = statuses.get(alias)
            took = max(0.0, now - started)
            if status in ANSWERED and self._done(alias, pending):
                cost = Cost(load_s=took, bytes=self._bytes(alias), at=self.wall())
                self.costs[alias] = cost
                if key is not None:
                    self.by_key[key] = cost
                measured = True
                log.info("model.loaded", model=alias, load_s=round(took, 3), bytes=cost.bytes)
                if self.on_loaded is not None:
                    self.on_loaded(alias)
                if key is not None and not self.book.record(key, cost):
                    log.debug("loads.not_recorded", model=alias)
            elif self._stopped(status, took) and self._done(alias, pending):
                log.info("model.load_unmeasured", model=alias, status=status)
        return measured

    @staticmethod
    def _stopped(status: str | None, took: float) -> bool:
        """Stopped before it answered (or never will): no measurement."""
        return (status is not None and status not in LOADING) or took > MAX_LOAD_S

    def _done(self, alias: str, pending: tuple[float, str | None]) -> bool:
        """Take ``alias`` off the pending loads unless the placement thread started it again
        meanwhile (a new child of the same model: its own load)."""
        if self.pending.get(alias) != pending:
            return False
        self.pending.pop(alias, None)
        return True

    def _bytes(self, alias: str) -> int:
        try:
            return self.fs.read_limit(model_cgroup(self.group, alias), kf.MEMORY_CURRENT) or 0
        except (LeafNameError, GovernorError):
            return 0
