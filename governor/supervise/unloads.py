"""Unloads of a router's models that another policy's shed made (issue 46 item 5): the shedder
(monitor/actions/shedder.py) journals each step in its victim's journal (rundir/journal.py:
source "shed", step "unload", the model), and before this they were counted only in the
shedder's ``governor_shed_total{step="unload"}``. The victim's launch follows its own journal
(supervise/models.py ModelLeaves.tick, every SAMPLE_S) and counts each such entry as its
router's unload with reason ``shed`` (``governor_model_unloads_total``, `status`).

Standard library only (the run time's import set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from governor.plan.model import ShedStep

if TYPE_CHECKING:
    from governor.rundir.journal import Journal

SHED_REASON = "shed"  # RunState.router unloads' reason of a shed's unload


class ShedUnloads:
    """The models a shed unloaded since the last look (:meth:`new`); the entries before the
    first look are an older run's (the journal outlives a run) and are not counted."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._seen: int | None = None  # the last entry id looked at
        self._size: int | None = None  # the journal's size then: unchanged, not read again

    def new(self) -> list[str]:
        try:
            size = self.journal.path.stat().st_size
        except OSError:
            size = 0
        if size == self._size:
            return []
        self._size = size
        entries = self.journal.entries()
        if self._seen is None:
            self._seen = max((e["id"] for e in entries), default=0)
            return []
        models: list[str] = []
        for e in entries:
            if e["id"] <= self._seen:
                continue
            self._seen = e["id"]
            model = e.get("model")
            if e.get("source") == "shed" and e.get("step") == ShedStep.UNLOAD and model:
                models.append(str(model))
        return models
