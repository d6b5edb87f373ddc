"""The router's model leaves as the kernel holds them (issue 44 item 4): ``<group>/models/*``,
one per model the router ran in this group (kernel/leafname.py names them). A leaf stays after
its model is unloaded; a process in it is a loaded model (a child that is exiting still holds
its memory). The one listing every reader takes: the live board's rows, the activity sampler.

Standard library only (the run time's import set).
"""

from __future__ import annotations

from governor.errors import BackendError, PermissionDenied
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import models_cgroup


def model_leaves(fs: CgroupFs, group: str) -> list[tuple[str, str]]:
    """(cgroup, leaf name) of every model leaf under ``<group>/models``, sorted; none when
    ``models/`` is not there (no router, or no model placed yet) or cannot be listed."""
    try:
        cgroups = fs.children(models_cgroup(group))
    except (BackendError, PermissionDenied):
        return []
    return [(cg, cg.rsplit("/", 1)[1]) for cg in cgroups]


def holds_process(fs: CgroupFs, cgroup: str) -> bool | None:
    """Whether a process is in the leaf now (its model is loaded); None when the leaf went
    away meanwhile or cannot be read."""
    try:
        return bool(fs.procs(cgroup))
    except (BackendError, PermissionDenied):
        return None
