"""probe() with systemd as PID 1 (systemd tier, in the guest)."""

from __future__ import annotations

import subprocess

import pytest

from governor.plan.host import probe

pytestmark = pytest.mark.systemd(min_version=252)


def test_probe_reports_systemd_as_pid1_with_its_version() -> None:
    host = probe()
    assert host.pid1 == "systemd"
    first = subprocess.run(
        ["systemctl", "--version"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert host.systemd_version == int(first[1])
    assert host.systemd_version >= 252
    assert host.cgroup_layout == "unified"
    assert {"memory", "cpu", "pids"} <= host.controllers
