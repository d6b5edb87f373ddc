"""probe() against fixture trees of real and realistic hosts (tests/fixtures/hosts/README.md).

Needs: nothing but the fixture trees; the last tests read this machine's /proc and /sys
read-only and are skipped where its hybrid layout is absent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from governor.errors import HostError
from governor.plan.host import CgroupLevel, CoreTypes, HostFacts, probe

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
GIB = 1024**3


def _copy(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(HOSTS / name, dest)
    return dest


def test_debian12_host_has_unified_cgroup2_with_all_controllers() -> None:
    root = HOSTS / "cgroup2-full"
    host = probe(root)
    assert host.root == str(root)
    assert host.cgroup_layout == "unified"
    assert host.cgroup_mount == str(root / "sys/fs/cgroup")
    assert host.controllers == frozenset(
        {"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"}
    )
    assert host.subtree_control == frozenset({"cpuset", "cpu", "io", "memory", "pids"})
    assert host.v1_controllers == frozenset()
    assert host.path == ()
    assert host.cpus_online == host.cpus_possible == (0, 1, 2, 3)
    assert host.core_types is None  # cpufreq identical on all four
    assert host.mem_total == 8131232 * 1024
    assert 7 * GIB < host.mem_total < 8 * GIB
    assert host.mem_available == 7512004 * 1024
    assert host.page_size == 4096
    assert host.kernel_release == "6.1.0-18-amd64"
    assert host.kernel_version == (6, 1)
    assert host.psi is True
    assert host.pid1 == "systemd"
    assert host.systemd_version == 252
    assert host.numa_nodes == (0,)
    assert host.euid == 0


def test_rk3588_splits_cores_by_cpu_capacity() -> None:
    host = probe(HOSTS / "rk3588")
    assert host.cgroup_layout == "unified"
    assert host.controllers == frozenset({"cpuset", "cpu", "io", "memory", "pids"})
    assert host.subtree_control == frozenset()
    assert host.cpus_online == tuple(range(8))
    assert host.core_types == CoreTypes(
        little=(0, 1, 2, 3), big=(4, 5, 6, 7), source="cpu_capacity"
    )
    assert host.mem_total == 2013492 * 1024
    assert host.kernel_version == (6, 1)
    assert host.psi is True
    assert host.systemd_version == 252  # found in the multiarch dir usr/lib/aarch64-linux-gnu
    assert host.page_size == 4096


def test_old_board_without_cpu_capacity_splits_cores_by_cpufreq() -> None:
    host = probe(HOSTS / "old-big-little")
    assert host.core_types == CoreTypes(little=(0, 1, 2, 3), big=(4, 5, 6, 7), source="cpufreq")


def test_cgroup_v1_only_host_is_legacy_with_no_cgroup2_mount() -> None:
    host = probe(HOSTS / "old-big-little", target="governor.slice/npu-chat")
    assert host.cgroup_layout == "legacy"
    assert host.cgroup_mount is None
    assert host.controllers == host.subtree_control == frozenset()
    assert host.path == ()
    # "name=systemd" binds no controller; blkio is reported in cgroup2 spelling
    assert host.v1_controllers == frozenset(
        {"cpu", "cpuacct", "memory", "cpuset", "io", "pids", "freezer", "devices"}
    )
    assert host.kernel_version == (4, 14)
    assert host.psi is False
    assert host.systemd_version == 237  # lib/systemd on a non-merged-/usr system


def test_missing_proc_pressure_is_a_fact_not_an_error() -> None:
    host = probe(HOSTS / "no-psi")
    assert host.psi is False
    assert "missing" in host.psi_detail
    assert "memory" not in host.controllers  # Raspberry Pi kernels boot with cgroup_disable=memory
    assert host.systemd_version == 247
    assert host.kernel_version == (5, 10)


def test_hybrid_host_fixture_has_controllers_held_by_v1() -> None:
    root = HOSTS / "hybrid-host"
    host = probe(root)
    assert host.cgroup_layout == "hybrid"
    assert host.cgroup_mount == str(root / "sys/fs/cgroup/unified")
    assert host.controllers == frozenset({"hugetlb"})
    assert host.subtree_control == frozenset()
    assert {"memory", "cpu", "cpuset", "io", "pids"} <= host.v1_controllers
    assert host.psi is True
    assert host.pid1 == "process_api"
    assert host.systemd_version is None  # only looked up when PID 1 is systemd
    assert host.core_types is None  # cpu_capacity 1024 on both


def test_target_records_existing_levels_and_stops_at_the_first_missing() -> None:
    host = probe(HOSTS / "cgroup2-full", target="governor.slice/npu-chat")
    assert host.path == (
        CgroupLevel(
            path="governor.slice",
            controllers=frozenset({"cpuset", "cpu", "io", "memory", "pids"}),
            subtree_control=frozenset({"memory", "pids"}),
        ),
    )


def test_target_with_dotdot_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"\.\."):
        probe(HOSTS / "cgroup2-full", target="governor.slice/../etc")


def test_cgroup_root_overrides_the_mount_from_mountinfo(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    (cg / "a.slice").mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpu memory pids\n")
    (cg / "cgroup.subtree_control").write_text("memory\n")
    (cg / "a.slice" / "cgroup.controllers").write_text("memory\n")
    (cg / "a.slice" / "cgroup.subtree_control").write_text("")
    host = probe(HOSTS / "rk3588", cgroup_root=cg, target="a.slice")
    assert host.cgroup_mount == str(cg)
    assert host.cgroup_layout == "unified"
    assert host.controllers == frozenset({"cpu", "memory", "pids"})
    assert host.subtree_control == frozenset({"memory"})
    assert host.path == (
        CgroupLevel(path="a.slice", controllers=frozenset({"memory"}), subtree_control=frozenset()),
    )


def test_no_cgroup_mounts_at_all_is_layout_none(tmp_path: Path) -> None:
    root = _copy("rk3588", tmp_path)
    mountinfo = root / "proc/self/mountinfo"
    lines = mountinfo.read_text().splitlines(keepends=True)
    mountinfo.write_text("".join(line for line in lines if " - cgroup" not in line))
    host = probe(root)
    assert host.cgroup_layout == "none"
    assert host.cgroup_mount is None
    assert host.v1_controllers == frozenset()


def test_unreadable_meminfo_makes_probing_impossible(tmp_path: Path) -> None:
    root = _copy("rk3588", tmp_path)
    (root / "proc/meminfo").unlink()
    with pytest.raises(HostError, match="proc/meminfo") as info:
        probe(root)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_garbled_cgroup_controllers_is_a_host_error_with_the_path(tmp_path: Path) -> None:
    root = _copy("rk3588", tmp_path)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("+cpu\n")
    with pytest.raises(HostError, match=r"cgroup\.controllers"):
        probe(root)


def test_missing_kernel_page_size_off_host_is_an_error(tmp_path: Path) -> None:
    root = _copy("rk3588", tmp_path)
    (root / "proc/self/smaps").write_text("")
    with pytest.raises(HostError, match="KernelPageSize"):
        probe(root)


def test_missing_node_online_defaults_to_node_zero(tmp_path: Path) -> None:
    root = _copy("rk3588", tmp_path)
    (root / "sys/devices/system/node/online").unlink()
    assert probe(root).numa_nodes == (0,)


def test_host_facts_round_trip_through_json() -> None:
    host = probe(HOSTS / "cgroup2-full", target="governor.slice")
    data = host.to_dict()
    assert data["controllers"] == sorted(host.controllers)  # stable, diffable output
    assert HostFacts.from_dict(json.loads(json.dumps(data))) == host


def test_host_facts_are_frozen_and_reject_unknown_fields() -> None:
    host = probe(HOSTS / "rk3588")
    with pytest.raises(AttributeError):  # FrozenRecordError
        setattr(host, "psi", False)  # noqa: B010 -- the attribute is read-only for mypy
    with pytest.raises(ValueError, match="surprise"):
        HostFacts.from_dict({**host.to_dict(), "surprise": 1})


# --- this machine, read-only ---------------------------------------------------------------------

HYBRID_HERE = Path("/sys/fs/cgroup/unified/cgroup.controllers").exists()


@pytest.mark.skipif(not HYBRID_HERE, reason="needs a hybrid host with /sys/fs/cgroup/unified")
def test_this_hybrid_host_probes_read_only() -> None:
    host = probe()
    assert host.root == "/"
    assert host.cgroup_layout == "hybrid"
    assert host.cgroup_mount == "/sys/fs/cgroup/unified"
    assert host.psi is True
    assert host.mem_total > 0
    assert host.page_size > 0
    assert host.cpus_online
