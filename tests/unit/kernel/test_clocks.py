"""The clock door (governor/kernel/clocks.py): its parsers with text from a real RK3588, and
discovery of the rk3588 fixture's cpufreq policies and devfreq devices.

Needs: the rk3588 host fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.clocks import FIXTURE_SYS

from governor.errors import BackendError
from governor.kernel import clocks as kc


def test_frequency_lists_parse_ascending_without_duplicates() -> None:
    # scaling_available_frequencies ends in a space on cpufreq-dt (show_available_freqs)
    text = "408000 600000 816000 1008000 1200000 1416000 1608000 1800000 \n"
    assert kc.parse_frequencies(text) == (
        408000, 600000, 816000, 1008000, 1200000, 1416000, 1608000, 1800000,
    )  # fmt: skip
    assert kc.parse_frequencies("2112000000 528000000 528000000") == (528000000, 2112000000)
    with pytest.raises(ValueError, match="not a frequency list"):
        kc.parse_frequencies("408000 fast")


def test_compatible_is_nul_separated() -> None:
    assert kc.parse_compatible(b"rockchip,rk3588-mali\0arm,mali-bifrost\0") == (
        "rockchip,rk3588-mali",
        "arm,mali-bifrost",
    )


def test_discover_finds_the_three_clusters_and_three_devfreq_devices() -> None:
    devices = kc.discover(FIXTURE_SYS)
    assert [(d.kind, d.name) for d in devices] == [
        ("cpufreq", "policy0"),
        ("cpufreq", "policy4"),
        ("cpufreq", "policy6"),
        ("devfreq", "dmc"),
        ("devfreq", "fb000000.gpu"),
        ("devfreq", "fdab0000.npu"),
    ]
    by = {d.name: d for d in devices}
    assert by["policy0"].cpus == (0, 1, 2, 3) and by["policy6"].cpus == (6, 7)
    # ranked like cpu.cpus = "big": cpu_capacity 414 (A55) vs 1024 (A76)
    assert (by["policy0"].capacity, by["policy4"].capacity) == (414, 1024)
    assert by["policy4"].frequencies[-1] == 2352000
    # the device tree's OPPs (fixtures README): 408-2208 MHz and the chip's one top bin
    big = (408, 600, 816, 1008, 1200, 1416, 1608, 1800, 2016, 2208, 2352)
    assert by["policy4"].frequencies == by["policy6"].frequencies == tuple(f * 1000 for f in big)
    assert by["policy0"].frequencies == tuple(f * 1000 for f in big[:8])
    assert by["fb000000.gpu"].frequencies == tuple(f * 100_000_000 for f in range(3, 11))
    assert by["fb000000.gpu"].compatible == ("arm,mali-bifrost",)
    assert "userspace" in by["policy4"].governors
    assert by["dmc"].frequencies == (528000000, 1068000000, 1560000000, 2112000000)
    assert by["fdab0000.npu"].compatible == ("rockchip,rk3588-rknpu",)
    assert "rknpu_ondemand" in by["fdab0000.npu"].governors
    assert all(Path(d.path).is_absolute() for d in devices)


def test_a_board_without_clocks_has_none(tmp_path: Path) -> None:
    assert kc.discover(tmp_path) == ()


def test_without_cpu_capacity_clusters_rank_by_max_frequency(tmp_path: Path) -> None:
    import shutil

    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURE_SYS, sysfs, symlinks=True)
    for cap in (sysfs / "devices/system/cpu").glob("cpu*/cpu_capacity"):
        cap.unlink()
    ranks = {d.name: d.capacity for d in kc.discover(sysfs) if d.kind == "cpufreq"}
    assert ranks == {"policy0": 1800000, "policy4": 2352000, "policy6": 2352000}


def test_writes_never_create_a_file(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="ENOENT") as err:
        kc.write(str(tmp_path / "scaling_governor"), "performance")
    assert err.value.exit_code == 71
    assert not (tmp_path / "scaling_governor").exists()
