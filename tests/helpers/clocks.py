"""A writable copy of the rk3588 fixture's clock tree (cpufreq policy0/4/6, devfreq dmc,
fb000000.gpu, fdab0000.npu), for the [clocks] tests of every tier, and a snapshot of every clock
file in it to prove a restore exact."""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURE_SYS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "rk3588" / "sys"
POLICY4 = "devices/system/cpu/cpufreq/policy4"
POLICY6 = "devices/system/cpu/cpufreq/policy6"
POLICY0 = "devices/system/cpu/cpufreq/policy0"
DMC = "devices/platform/dmc/devfreq/dmc"
GPU = "devices/platform/fb000000.gpu/devfreq/fb000000.gpu"
NPU = "devices/platform/fdab0000.npu/devfreq/fdab0000.npu"
_CLOCK_DIRS = ("devices/system/cpu/cpufreq", "devices/platform")


def board(where: Path) -> Path:
    """``where``/sys: the fixture's sysfs, class/devfreq links kept as links."""
    sysfs = where / "sys"
    shutil.copytree(FIXTURE_SYS, sysfs, symlinks=True)
    return sysfs


def snapshot(sysfs: Path) -> dict[str, str]:
    """Every clock file's value (as the kernel reads it back: stripped), by path relative to
    ``sysfs``."""
    return {
        str(p.relative_to(sysfs)): p.read_text().strip()
        for d in _CLOCK_DIRS
        for p in sorted((sysfs / d).rglob("*"))
        if p.is_file()
    }


def read(sysfs: Path, device: str, file: str) -> str:
    return (sysfs / device / file).read_text().strip()
