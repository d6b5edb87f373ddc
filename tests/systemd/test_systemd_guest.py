"""Proof that the systemd tier works: systemd >= 252 is PID 1, transient scopes get their
resource properties applied to cgroupfs and reported by `systemctl show`, and pystemd reaches
the manager over D-Bus.

Runs in the qemu guest with systemd as PID 1 (scripts/test --tier systemd).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import Spawn
from helpers.units import systemctl_show, systemd_version

pytestmark = pytest.mark.systemd(min_version=252)


def test_pid1_is_systemd_252_or_newer() -> None:
    assert Path("/proc/1/comm").read_text().strip() == "systemd"
    assert systemd_version() >= 252


def test_transient_scope_properties_reach_cgroupfs(cgroup2_root: Path, spawn: Spawn) -> None:
    unit = f"gtest-{uuid.uuid4().hex[:12]}"
    scope = f"{unit}.scope"
    proc = spawn(
        ["systemd-run", "--scope", "-p", "MemoryHigh=100M", "-p", "AllowedCPUs=1",
         "--unit", unit, "sleep", "300"],
    )  # fmt: skip

    def cgroup_dir() -> Path | None:
        cg = systemctl_show(scope, "ControlGroup", "ActiveState")
        if cg.get("ActiveState") != "active" or not cg.get("ControlGroup"):
            return None
        path = cgroup2_root / cg["ControlGroup"].lstrip("/")
        return path if (path / "cgroup.procs").exists() else None

    path = cgroups.wait_for(cgroup_dir, 120, f"{scope} to become active", interval=0.5)
    try:
        assert cgroups.read(path / "memory.high") == "104857600"
        assert cgroups.read(path / "cpuset.cpus") == "1"
        assert cgroups.read(path / "cpuset.cpus.effective") == "1"
        assert proc.pid in cgroups.pids(path)
        props = systemctl_show(scope, "MemoryHigh", "AllowedCPUs")
        assert props == {"MemoryHigh": "104857600", "AllowedCPUs": "1"}
    finally:
        subprocess.run(["systemctl", "stop", scope], check=False, timeout=120)
    proc.wait(timeout=120)
    cgroups.wait_for(lambda: not path.exists(), 120, f"{path} to be removed")
    assert systemctl_show(scope, "ActiveState")["ActiveState"] in {"inactive", "failed"}


def test_pystemd_reaches_the_manager() -> None:
    from pystemd.systemd1 import Manager

    with Manager() as m:
        version = m.Manager.Version
    text = version.decode() if isinstance(version, bytes) else str(version)
    assert int(text.split(".")[0].split()[0]) >= 252
