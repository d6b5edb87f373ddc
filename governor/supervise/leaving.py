"""An unloaded model's leaf goes with it (issue 46 item 5: a leaf stayed behind each unload;
its next child gets a new one with its limits, supervise/models.py _leaf).

The leaf is removed once ``cgroup.events`` says it is not populated. An exiting child leaves
cgroup.procs as soon as its last thread is dying, but populates the leaf until its whole address
space is torn down (exit_mm comes before cgroup_exit): the kernel refuses the rmdir (EBUSY)
meanwhile, under TCG for about a second after the evictor saw an empty cgroup.procs (CI
2026-12-06: the leaf stayed). So each unloaded model's leaf is tried at its unload and again at
every round of the router thread, up to RETRY_S. A new child placed meanwhile keeps it (EBUSY
until RETRY_S); one the placement thread is about to move a child into is made again at its
next poll (its move failed: not placed yet).
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable

from governor.errors import GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import LeafNameError
from governor.log import get_logger

log = get_logger(__name__)

RETRY_S = 30.0  # an unloaded model's leaf is tried this long while a child populates it


class LeavingLeaves:
    """The leaves of the models unloaded in this run, until each is removed (module
    docstring); ``cgroup(model)``: the model's leaf (LeafNameError: its name maps to none).
    Used by the router thread alone."""

    def __init__(
        self,
        fs: CgroupFs,
        cgroup: Callable[[str], str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fs = fs
        self.cgroup = cgroup
        self.clock = clock
        self.pending: dict[str, float] = {}  # model -> until when its leaf is tried

    def add(self, model: str) -> None:
        """``model`` was unloaded: its leaf is tried now and at each :meth:`retry`."""
        self.pending[model] = self.clock() + RETRY_S
        self.retry()

    def retry(self) -> None:
        now = self.clock()
        for model, until in list(self.pending.items()):
            if self.remove(model) or now >= until:
                del self.pending[model]

    def remove(self, model: str) -> bool:
        """rmdir the model's leaf unless it is populated; True when done with it (removed,
        gone, or no leaf for its name)."""
        try:
            cg = self.cgroup(model)
        except LeafNameError:
            return True
        try:
            if self.fs.populated(cg):
                return False
            self.fs.rmdir(cg)
        except GovernorError as err:
            if getattr(err, "errno", None) == errno.ENOENT:
                return True  # gone already
            log.debug("models.leaf_kept", model=model, error=str(err))
            return False
        log.info("model.leaf_removed", model=model, cgroup=cg)
        return True
