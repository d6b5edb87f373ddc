"""A lowered budget reaches inside the model leaves (issue 46 item 4): while a higher-class
admission holds a router's budget lowered (rundir/cap.py), each loaded model's leaf gets
memory.high at its share of that budget, and its memory.high as it was once the cap is gone.

The cap alone bounds only the router's LOADS (supervise/evict.py budget): a model that stays
loaded and busy could still grow inside its own leaf (llama-server's host prompt cache,
``--cache-ram``, its compute buffers, the page cache of what it reads) up to its leaf's
memory.max, or without bound when it has none, into the room the admission promised the
higher class. Its share is what the admission counted for it when it lowered the budget
(board/unloading.py model_claim: its estimate, else its leaf's memory.max, else its
memory.current; the evictor's :meth:`~governor.supervise.evict.Evictor.claim`), and never less
than what it holds when the cap is first seen: memory.high throttles and reclaims above it
(the page cache first), it never kills, and a share under what a busy model already holds
would stall its request in reclaim for memory the admission did not count on freeing.

- a model loaded while the cap holds (the evictor let it in under the budget) gets its share
  at the next round;
- a leaf whose memory.high no longer reads its share (made again for the model's next child
  with its planned limits, supervise/models.py; or tuned meanwhile) gets it again, and that
  new value back after;
- given back: each leaf's memory.high is written back to what it read before, unless someone
  else (`governor tune`, an operator) changed it since: theirs stays; a leaf that went away
  (its model unloaded) is forgotten.

It runs in the model leaves' router thread every SYNC_S, never raises (logged), and reads the
cap through the same door as the evictor. Standard library only (the run time's import set).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.log import get_logger

if TYPE_CHECKING:
    from governor.rundir.cap import Cap
    from governor.supervise.evict import Evictor

log = get_logger(__name__)

SYNC_S = 0.5  # between two rounds (the activity's sampling interval)


class CapHigh:
    """memory.high at each loaded model's share while ``cap()`` returns a cap (module
    docstring); ``evictor``: its leaves, which hold a process, and each model's claim."""

    def __init__(
        self,
        evictor: Evictor,
        cap: Callable[[], Cap | None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.evictor = evictor
        self.cap = cap
        self.clock = clock
        self.held: dict[str, tuple[str, str]] = {}  # leaf -> (memory.high before, written)
        self._last: float | None = None

    def sync(self) -> None:
        """One round when SYNC_S passed (module docstring); never raises."""
        now = self.clock()
        if self._last is not None and now - self._last < SYNC_S:
            return
        self._last = now
        try:
            cap = self.cap()
        except Exception as err:  # another process's file: never a crash
            log.warning("cap_high.cap_unreadable", error=str(err))
            return
        try:
            if cap is None:
                self._give_back()
            else:
                self._hold(cap)
        except Exception as err:  # never the end of the router thread
            log.error("cap_high.crashed", error=repr(err))

    def _hold(self, cap: Cap) -> None:
        ev = self.evictor
        for alias in ev.loaded(exclude=""):
            cg = ev.cgroup(alias)
            if cg is None:
                continue
            try:
                before = ev.fs.read(cg, kf.MEMORY_HIGH).strip()
                if cg in self.held and before == self.held[cg][1]:
                    continue  # its share holds
                current = ev.fs.read_limit(cg, kf.MEMORY_CURRENT) or 0
                share = str(max(ev.claim(alias), current))
                ev.fs.write(cg, kf.MEMORY_HIGH, share)
                # what the kernel keeps: a byte count rounded down to its page size, so the
                # next round's read and the give-back's compare with that, not with `share`
                share = ev.fs.read(cg, kf.MEMORY_HIGH).strip()
            except GovernorError as err:  # its leaf went away meanwhile
                log.debug("cap_high.skipped", cgroup=cg, error=str(err))
                continue
            self.held[cg] = (before, share)
            log.info("cap_high.held", model=alias, cgroup=cg, memory_high=int(share),
                     before=before, by=cap.by)  # fmt: skip

    def _give_back(self) -> None:
        held, self.held = self.held, {}
        for cg, (before, written) in held.items():
            try:
                if self.evictor.fs.read(cg, kf.MEMORY_HIGH).strip() != written:
                    continue  # changed by someone else meanwhile: theirs stays
                self.evictor.fs.write(cg, kf.MEMORY_HIGH, before)
            except GovernorError:
                continue  # its leaf went away (its model unloaded)
            log.info("cap_high.given_back", cgroup=cg, memory_high=before)
