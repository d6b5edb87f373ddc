"""`governor doctor` in the composition root: what this host supports and what it lacks.

Apart from api/compile.py so that doctor, the first command run on a new board, costs a probe of
the host and not the compile-time stack: it imports neither pydantic, the policy models, the
compiler nor the engines' code (tests/unit/cli/test_command_imports.py holds that line)."""

from __future__ import annotations

from pathlib import Path

from governor.api.host import HostOptions, probe_host, sysfs_root
from governor.backends.placement import parse_proc_cgroup
from governor.compile.doctor import (
    Finding,
    diagnose,
    mglru_finding,
    swap_finding,
    write_probe_findings,
)
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.mglru import MglruReader
from governor.kernel.procfs import ProcFs
from governor.kernel.swap import SwapReader
from governor.kernel.writeprobe import probe_peak_reset, probe_reclaim_swappiness
from governor.plan.host import HostFacts


def doctor(opts: HostOptions) -> tuple[HostFacts, list[Finding]]:
    """The host's facts and a finding per topic; the write probes only into this host's
    cgroupfs or an explicit --cgroup-root."""

    host = probe_host(opts)
    swap = SwapReader(opts.root / "proc", sysfs_root(opts)).read()
    lru = MglruReader(sysfs_root(opts)).read()
    found = [*diagnose(host), swap_finding(swap, host.kernel_version), mglru_finding(lru)]
    # the write probes only on this host's cgroupfs or an explicit --cgroup-root: never into
    # a --root tree (the fixture boards)
    mount = opts.cgroup_root or (Path(host.cgroup_mount) if host.cgroup_mount else None)
    if mount is not None and (opts.cgroup_root is not None or opts.root == Path("/")):
        fs, own = CgroupFs(mount), _own_cgroup(opts.root / "proc")
        found += write_probe_findings(probe_peak_reset(fs, own), probe_reclaim_swappiness(fs, own))
    return host, found


def _own_cgroup(proc: Path) -> str | None:
    try:
        return parse_proc_cgroup(ProcFs(proc).self_cgroup()) or None
    except (OSError, ValueError):
        return None
