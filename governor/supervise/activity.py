"""Each model's last request under llama-server's router (issue 38 item 4), as the supervisor
keeps it: the router keeps its own least-recently-used time (``meta.last_used``) but publishes
it nowhere, so :class:`Activity` reads each model leaf's ``cpu.stat`` ``usage_usec`` (present
in every cgroup v2 group, with or without the cpu controller) every 0.5 s; a leaf that used
more than ``BUSY_USEC`` of CPU since is asked for its slots (governor/peer/router.py), and a
slot's new task (or one in flight) dates the model's last request: CPU alone is no request (a
probe of its slots by a shedder costs the child CPU; so does housekeeping that TCG inflates:
a CI guest run unloaded the model used last, not the idle one). A model's load is its first
request.

A child started with ``--no-slots`` answers no slots: its CPU alone dates it, and the CPU a
probe of its slots costs it (the evictor's, the `unload` action's, the activity's own) would
date a request at every probe. Each probe this process makes is recorded (peer/router.py
probed_at): the CPU of such a model in an interval in which it was probed by another of this
process's clients is taken as the probe's, not dated (a request in that same interval is
missed with it); its own probe is rebased as for any model.

Standard library only (the run time's import set).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

from governor.errors import GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import (
    LeafNameError,
    leaf_name,
    model_cgroup,
    model_leaves,
    model_name,
)
from governor.peer.router import RouterClient, probed_at, slot_tasks

BUSY_USEC = 2000  # CPU a model leaf used between two samples that counts as a request


class Activity:
    """Each model's last request (epoch seconds), from its leaf's CPU use (module docstring).
    ``sample`` is one look at every model leaf; ``touch`` dates a model now (its load).

    With a ``client``, CPU alone does not date a request: a leaf that used ``busy_usec`` is
    asked for its slots, and only a slot's new task (or one processing) dates it; CPU the
    child spent otherwise (another governor's probe of its slots, its own housekeeping,
    which TCG inflates) leaves its last request where it was. Slots that cannot be read fall
    back to the CPU."""

    def __init__(
        self,
        fs: CgroupFs,
        group: str,
        *,
        clock: Callable[[], float] = time.time,
        busy_usec: int = BUSY_USEC,
        client: RouterClient | None = None,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fs = fs
        self.group = group
        self.clock = clock
        self.busy_usec = busy_usec
        self.client = client
        self.last: dict[str, float] = {}  # alias -> epoch of its last request
        self.leaves: dict[str, str] = {}  # leaf name -> alias, of every model touched
        self._usage: dict[str, int] = {}  # alias -> usage_usec at the previous sample
        self._tasks: dict[str, tuple[tuple[Any, Any, bool], ...]] = {}  # alias -> slot_tasks
        self.mono = mono
        self.unreadable: set[str] = set()  # models whose slots could not be read (--no-slots)
        self._own: dict[str, float | None] = {}  # alias -> probed_at of the activity's own probe
        self._looked: float | None = None  # mono of the previous sample

    def touch(self, alias: str, when: float | None = None) -> None:
        self.last[alias] = self.clock() if when is None else when
        with contextlib.suppress(LeafNameError):  # no leaf: never sampled
            self.leaves[leaf_name(alias)] = alias

    def model_of(self, leaf: str) -> str:
        """The model a leaf under ``models/`` belongs to: the one placed there in this run,
        else the name the leaf reads back as (kernel/leafname.py), else the leaf's own name."""
        return self.leaves.get(leaf) or model_name(leaf) or leaf

    def sample(self) -> bool:
        """Read every model leaf's usage_usec; True when a model's last request moved."""
        now = self.clock()
        looked, self._looked = self._looked, self.mono()
        moved = False
        for cg, leaf in model_leaves(self.fs, self.group):
            alias = self.model_of(leaf)
            try:
                usage = self.fs.cpu_stat(cg).get("usage_usec", 0)
            except GovernorError:
                continue
            before = self._usage.get(alias)
            self._usage[alias] = usage
            if before is None or usage - before < self.busy_usec or self._probed(alias, looked):
                continue
            if self._served(alias):
                self.last[alias] = now
                moved = True
        return moved

    def _probed(self, alias: str, since: float | None) -> bool:
        """Whether ``alias``, whose slots cannot be read, was probed by another of this
        process's clients since the previous sample: its CPU is that probe's."""
        url = getattr(self.client, "url", None)
        if alias not in self.unreadable or url is None or since is None:
            return False
        at = probed_at(url, alias)
        return at is not None and at >= since and at != self._own.get(alias)

    def _served(self, alias: str) -> bool:
        """Whether the CPU ``alias`` used was a request: its slots show a new task or one in
        flight (the probe's own CPU is taken as the next base); True without a client or
        when its slots cannot be read."""
        if self.client is None:
            return True
        slots = self.client.slots(alias)
        self.rebase([alias])
        url = getattr(self.client, "url", None)
        self._own[alias] = None if url is None else probed_at(url, alias)
        if slots is None:
            self.unreadable.add(alias)
            return True
        self.unreadable.discard(alias)
        tasks = slot_tasks(slots)
        new = tasks != self._tasks.get(alias)
        self._tasks[alias] = tasks
        return new or any(busy for _id, _task, busy in tasks)

    def rebase(self, aliases: Iterable[str]) -> None:
        """Take each model leaf's usage now as the next sample's base without dating it: the
        governor's own probe of its slots (GET /slots, peer/router.py idle_lru) costs its child CPU
        that is no request (a request within the last sample interval is missed with it)."""
        for alias in aliases:
            try:
                cg = model_cgroup(self.group, alias)
                self._usage[alias] = self.fs.cpu_stat(cg).get("usage_usec", 0)
            except (GovernorError, LeafNameError):
                continue
