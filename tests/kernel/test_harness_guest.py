"""Proof that the kernel tier works: a real cgroup2 hierarchy with controllers, OOM group kills
and memory.high pressure, driven only through raw cgroupfs writes and the workload helpers.

Runs in the kernel test guest (scripts/test --tier kernel). Under TCG the guest is 5-10x slower
than the host: generous timeouts, no timing assertions.
"""

from __future__ import annotations

from pathlib import Path

import helpers
import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice, Spawn

CORE = ("cpuset", "cpu", "io", "memory", "pids")

pytestmark = pytest.mark.kernel(controllers=CORE, root=True, psi=True)


def test_guest_has_cgroup2_with_controllers_and_psi(cgroup2_root: Path) -> None:
    assert cgroup2_root == Path("/sys/fs/cgroup")
    available = set(cgroups.read(cgroup2_root / "cgroup.controllers").split())
    assert set(CORE) <= available
    for res in ("cpu", "memory", "io"):
        assert "some avg10=" in Path(f"/proc/pressure/{res}").read_text()


def test_scratch_cgroup_has_controller_and_psi_files(
    enabled_root_subtree: Path, scratch_slice: ScratchSlice
) -> None:
    cg = scratch_slice.create()
    for f in ("memory.max", "memory.high", "memory.oom.group", "memory.events", "cpu.weight",
              "cpuset.cpus", "io.weight", "pids.max", "memory.pressure", "cgroup.kill"):  # fmt: skip
        assert (cg / f).exists(), f
    assert cgroups.psi_total(cg / "memory.pressure") == 0


def test_oom_group_kills_the_whole_cgroup_only(
    enabled_root_subtree: Path, scratch_slice: ScratchSlice, spawn: Spawn
) -> None:
    slice_ = scratch_slice.create()
    cgroups.write(slice_ / "cgroup.subtree_control", "+memory")
    outside = scratch_slice.child("outside")
    victim = scratch_slice.child("victim")
    cgroups.write(victim / "memory.max", "64M")
    if (victim / "memory.swap.max").exists():
        cgroups.write(victim / "memory.swap.max", "0")
    cgroups.write(victim / "memory.oom.group", "1")
    assert cgroups.read(victim / "memory.max") == str(64 << 20)

    bystander = spawn(helpers.argv(helpers.HOG, "--mib", 16), cgroup=outside)
    cgroups.wait_for(
        lambda: int(cgroups.read(outside / "memory.current")) >= 16 << 20, 120, "bystander hog"
    )
    hog = spawn(helpers.argv(helpers.HOG, "--mib", 200, "--step-mib", 8, "--children", 2),
                cgroup=victim)  # fmt: skip
    out, _ = hog.communicate(timeout=300)
    events = cgroups.read_kv(victim / "memory.events")
    assert hog.returncode == -9, out
    assert events["oom_kill"] >= 1, events
    assert events.get("oom_group_kill", 1) >= 1, events
    cgroups.wait_for(lambda: not cgroups.populated(victim), 60, "victim cgroup to empty")
    assert cgroups.pids(victim) == []
    assert bystander.poll() is None, "the process outside the OOMing cgroup must survive"
    assert cgroups.read_kv(outside / "memory.events")["oom_kill"] == 0


def test_memory_high_throttles_and_raises_pressure(
    enabled_root_subtree: Path, scratch_slice: ScratchSlice, spawn: Spawn
) -> None:
    cg = scratch_slice.create()
    cgroups.write(cg / "memory.high", "64M")
    if (cg / "memory.swap.max").exists():
        cgroups.write(cg / "memory.swap.max", "0")
    psi_file = cg / "memory.pressure"
    global_before = cgroups.psi_total(Path("/proc/pressure/memory"))
    assert cgroups.psi_total(psi_file) == 0
    # 96 MiB against a 64 MiB high: reclaim cannot free anon memory without swap, so the
    # kernel throttles the hog; it never finishes quickly and is never OOM-killed.
    hog = spawn(helpers.argv(helpers.HOG, "--mib", 96, "--step-mib", 4), cgroup=cg)

    def high_events() -> dict[str, int] | None:
        e = cgroups.read_kv(cg / "memory.events")
        return e if e["high"] > 0 else None

    events = cgroups.wait_for(high_events, 180, "memory.events high > 0")
    total = cgroups.wait_for(lambda: cgroups.psi_total(psi_file), 180, "cgroup memory PSI > 0")
    assert events["oom_kill"] == 0
    assert total > 0
    assert cgroups.psi_total(Path("/proc/pressure/memory")) > global_before
    assert hog.poll() is None, "memory.high must throttle, not kill"
