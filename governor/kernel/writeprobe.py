"""Late memory-controller features found by trying a harmless write, never by the version
number alone (issue 47): vendor and backported kernels carry features their version does not
say, and a kernel may leave one out.

- ``memory.peak`` reset, 6.12 (mm/memcontrol.c peak_write, Documentation/admin-guide/
  cgroup-v2.rst): a write of any non-empty string resets the peak for reads through the same
  file descriptor only, so a probe on any group changes nothing another reader sees. Before,
  the file is read-only (0444): the open for writing fails with EACCES even for root
  (kernfs_fop_open), or the write with EINVAL.
- ``memory.reclaim`` ``swappiness=``, 6.11 (Dan Schatzberg's "mm: add swappiness= arg to
  memory.reclaim"): ``0 swappiness=60`` asks for 0 bytes, so nothing is reclaimed; a kernel
  without the argument refuses the word with EINVAL.

The probe goes through :class:`CgroupFs` (the one door to cgroupfs).
"""

from __future__ import annotations

import errno
import stat
from typing import Literal

from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.record import record

Verdict = Literal["yes", "no", "unknown"]

PEAK_RESET_PROBE = kf.PEAK_RESET  # the sampler's own write (kernel/files.py)
RECLAIM_SWAPPINESS_PROBE = "0 swappiness=60"  # 0 bytes: reclaims nothing


@record(frozen=True)
class Probe:
    """One write tried: ``yes`` the kernel took it, ``no`` it refused the feature, ``unknown``
    the file is missing or could not be written (permissions, no memory controller)."""

    verdict: Verdict
    where: str  # the file tried, or why none was


def try_write(fs: CgroupFs, cgroup: str, file: str, text: str) -> Probe:
    """Write ``text`` to ``cgroup``'s ``file`` and read the kernel's answer."""
    where = f"/{cgroup}/{file}" if cgroup else f"/{file}"
    try:
        fs.write(cgroup, file, text)
    except GovernorError as err:
        code = getattr(err, "errno", None)
        if code == errno.EINVAL:
            return Probe("no", f"{where}: EINVAL")
        if code in (errno.EACCES, errno.EPERM) and _read_only(fs, cgroup, file):
            return Probe("no", f"{where}: read-only")
        return Probe("unknown", f"{where}: {errno.errorcode.get(code or 0, err)}")
    return Probe("yes", where)


def _read_only(fs: CgroupFs, cgroup: str, file: str) -> bool:
    """The kernel made the file without a write handler (mode 0444)."""
    try:
        mode = (fs.path(cgroup) / file).stat().st_mode
    except OSError:
        return False
    return not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def peak_group(fs: CgroupFs, own: str | None) -> str | None:
    """A group that has ``memory.peak`` (none in the root): this process's own, else the
    first top-level group with one; None when no group has it (no memory controller)."""
    cands = ([own] if own else []) + sorted(fs.children(""))
    for cg in cands:
        if (fs.path(cg) / kf.MEMORY_PEAK).is_file():
            return cg
    return None


def probe_peak_reset(fs: CgroupFs, own: str | None) -> Probe:
    group = peak_group(fs, own)
    if group is None:
        return Probe("unknown", f"no group with {kf.MEMORY_PEAK}")
    return try_write(fs, group, kf.MEMORY_PEAK, PEAK_RESET_PROBE)


def probe_reclaim_swappiness(fs: CgroupFs, own: str | None) -> Probe:
    """On this process's group, else the root's ``memory.reclaim`` (0 bytes either way)."""
    group = own if own and (fs.path(own) / kf.MEMORY_RECLAIM).is_file() else ""
    if not (fs.path(group) / kf.MEMORY_RECLAIM).is_file():
        return Probe("unknown", f"no {kf.MEMORY_RECLAIM} (Linux < 5.19 or no memory controller)")
    return try_write(fs, group, kf.MEMORY_RECLAIM, RECLAIM_SWAPPINESS_PROBE)
