"""Conversations that survive an unload (issue 46 item 3): with a router started with
``--slot-save-path``, the evictor (supervise/evict.py) has each idle slot of its victim saved
before the unload, and the model's next load gets them back, so the next turn of an idle chat
reads its KV cache from disk instead of processing its whole prompt again.

- :meth:`SlotKeeper.save` (the evictor's hook, in the model leaves' router thread, before
  ``POST /models/unload``): every slot of the victim that holds a conversation and has no
  request in flight (peer/router.py idle_slots) is saved through the router
  (``POST /slots/ID?action=save``, peer/router.py slot_action) as slot_file's name in the
  directory all children share; all the saves of one model end within SAVE_S (the model that
  waits for the room waits frozen that much longer at most);
- :meth:`SlotKeeper.placed` (the placement thread, no call to the router): a child of a model
  with saved slots started; :meth:`SlotKeeper.restore` (the router thread, each pass) asks the
  router for its models every POLL_S while one is pending and, once it is ``loaded``, restores
  each saved slot that has served no task yet (peer/router.py fresh_slots): one a request took
  first keeps that request's cache (llama-server would defer the restore until the request ends,
  then overwrite its cache). A child the router loads for a request takes that request at once:
  with ``-np 1`` its one slot is the request's and nothing is restored (logged); a model loaded
  ahead of its next request (``POST /models/load``) or with free slots gets its conversations
  back.

Nothing here runs in a monitor's thread: the monitor's ``unload`` and the shed's unload do not
save (a pressure response waits for no disk write). Every exchange is one of peer/http.py.
Standard library only (the run time's import set).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from governor.log import get_logger
from governor.peer.router import RouterClient, RouterError, fresh_slots, idle_slots, slot_file

if TYPE_CHECKING:
    from governor.rundir.journal import Journal

log = get_logger(__name__)

SAVE_S = 10.0  # all the saves of one model before its unload (a 4K-token slot: well under 1 s)
RESTORE_S = 10.0  # all the restores of one model after its load
POLL_S = 0.05  # between two GET /models while a model with saved slots loads
LOAD_S = 600.0  # a placed model's load is watched this long, then its saved slots are dropped
GRACE_S = 5.0  # a placed model the router lists neither loading nor loaded: dropped after this
SOURCE = "slots"  # the journal entries' source


class SlotKeeper:
    """What was saved of each unloaded model ({model: {slot id: file}}) and the models whose
    next load is watched for the restore (module docstring)."""

    def __init__(
        self,
        client: RouterClient,
        *,
        journal: Journal | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.journal = journal
        self.clock = clock
        self.saved: dict[str, dict[int, str]] = {}
        self.pending: dict[str, float] = {}  # model -> clock of its child's placement
        self.restored: dict[str, int] = {}  # model -> slots restored in this run
        self._lock = threading.Lock()  # placed() is the placement thread's, the rest the router's
        self._polled: float | None = None

    def save(self, model: str) -> list[int]:
        """Save each idle slot of ``model`` holding a conversation, before its unload; the
        slots saved (none when its slots cannot be read: --no-slots, no answer)."""
        client = self.client.within(SAVE_S)
        slots = client.slots(model)
        if slots is None:
            log.warning("slots.unreadable", model=model, reason="GET /slots did not answer")
            return []
        files: dict[int, str] = {}
        for slot in idle_slots(slots):
            name = slot_file(model, slot)
            try:
                said = client.slot_action(model, slot, "save", name)
            except RouterError as err:
                log.warning("slots.save_failed", model=model, slot=slot, reason=str(err))
                continue
            files[slot] = name
            log.info(
                "slots.saved", model=model, slot=slot, file=name, tokens=said.get("n_saved"),
                bytes=said.get("n_written"),
            )  # fmt: skip
        with self._lock:
            if files:
                self.saved[model] = files
            else:
                self.saved.pop(model, None)  # an older save is no longer this conversation
        if files:
            self._journal(model, saved=sorted(files))
        return sorted(files)

    def placed(self, model: str) -> None:
        """A child of ``model`` was placed: its load is watched when it has saved slots."""
        with self._lock:
            if model in self.saved:
                self.pending[model] = self.clock()

    def restore(self) -> dict[str, list[int]]:
        """One look at the pending models' loads (at most every POLL_S); restores each one that
        is loaded; {model: the slots restored} of those done now."""
        with self._lock:
            pending = dict(self.pending)
        now = self.clock()
        if not pending or (self._polled is not None and now - self._polled < POLL_S):
            return {}
        self._polled = now
        try:
            statuses = self.client.within(RESTORE_S).models()
        except RouterError as err:
            log.debug("slots.router_unreadable", reason=str(err))
            return {}
        done: dict[str, list[int]] = {}
        for model, since in pending.items():
            status = statuses.get(model)
            if status == "loaded":
                done[model] = self._restore(model)
            elif now - since > (LOAD_S if status == "loading" else GRACE_S):
                log.warning("slots.load_not_seen", model=model, status=status)
            else:
                continue
            with self._lock:
                self.pending.pop(model, None)
                self.saved.pop(model, None)
        return done

    def _restore(self, model: str) -> list[int]:
        with self._lock:
            files = dict(self.saved.get(model, {}))
        client = self.client.within(RESTORE_S)
        slots = client.slots(model)
        free = fresh_slots(slots) if slots is not None else set()
        restored: list[int] = []
        skipped: list[int] = []
        for slot, name in sorted(files.items()):
            if slot not in free:
                skipped.append(slot)  # a request took it first: its cache is that request's
                continue
            try:
                said = client.slot_action(model, slot, "restore", name)
            except RouterError as err:
                log.warning("slots.restore_failed", model=model, slot=slot, reason=str(err))
                skipped.append(slot)
                continue
            restored.append(slot)
            log.info(
                "slots.restored", model=model, slot=slot, file=name,
                tokens=said.get("n_restored"), ms=(said.get("timings") or {}).get("restore_ms"),
            )  # fmt: skip
        if skipped:
            log.info("slots.not_restored", model=model, slots=skipped, reason="slot in use")
        self.restored[model] = self.restored.get(model, 0) + len(restored)
        self._journal(model, restored=restored, skipped=skipped)
        return restored

    def _journal(self, model: str, **what: list[int]) -> None:
        if self.journal is None:
            return
        try:
            self.journal.append(SOURCE, [], model=model, **what)
        except OSError as err:
            log.warning("slots.journal_failed", model=model, error=str(err))
