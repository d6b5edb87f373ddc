"""diagnose() on each fixture host's probed facts: the key findings and their fixes."""

from __future__ import annotations

from pathlib import Path

from governor.compile.doctor import (
    CGROUP_KILL_MIN,
    PSI_FIX,
    UNIFIED_FIX,
    Finding,
    diagnose,
)
from governor.plan.host import CoreTypes, HostFacts, probe
from governor.record import replace

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"


def _by_topic(findings: list[Finding]) -> dict[str, Finding]:
    topics = [f.topic for f in findings]
    assert len(topics) == len(set(topics)), "one finding per topic"
    return {f.topic: f for f in findings}


def _facts(name: str, target: str | None = None) -> HostFacts:
    return probe(HOSTS / name, target=target)


def test_rk3588_is_ok_everywhere_with_big_cores_4_to_7() -> None:
    findings = _by_topic(diagnose(_facts("rk3588")))
    assert {f.topic: f.level for f in findings.values() if f.level != "ok"} == {}
    assert "big 4-7" in findings["cpus.core_types"].message
    assert "little 0-3" in findings["cpus.core_types"].message
    # empty root subtree_control is fine: governor enables controllers top-down
    assert "top-down" in findings["controller.memory"].message


def test_hybrid_host_memory_controller_is_an_error_with_the_unified_fix() -> None:
    findings = _by_topic(diagnose(_facts("hybrid-host")))
    memory = findings["controller.memory"]
    assert memory.level == "error"
    assert "cgroup v1" in memory.message
    assert memory.fix == UNIFIED_FIX
    assert "systemd.unified_cgroup_hierarchy=1" in UNIFIED_FIX
    assert findings["controller.io"].level == "error"  # bound to v1 as blkio
    assert findings["cgroup2"].level == "warn"
    assert findings["cgroup2"].fix == UNIFIED_FIX
    assert findings["psi"].level == "ok"
    assert findings["systemd"].level == "ok"
    assert "process_api" in findings["systemd"].message


def test_legacy_host_has_no_cgroup2_and_old_kernel_features_warn() -> None:
    findings = _by_topic(diagnose(_facts("old-big-little")))
    assert findings["cgroup2"].level == "error"
    assert findings["cgroup2"].fix == UNIFIED_FIX
    assert findings["controller.cpuset"].level == "error"
    assert findings["kernel.cgroup_kill"].level == "warn"
    assert "5.14" in findings["kernel.cgroup_kill"].message
    assert findings["kernel.clone_into_cgroup"].level == "warn"
    assert findings["systemd"].level == "warn"  # 237 has no AllowedCPUs=
    assert "cpufreq" in findings["cpus.core_types"].message


def test_missing_psi_and_memory_controller_are_reported_with_fixes() -> None:
    findings = _by_topic(diagnose(_facts("no-psi")))
    assert findings["psi"].level == "warn"
    assert findings["psi"].fix == PSI_FIX
    memory = findings["controller.memory"]
    assert memory.level == "error"
    assert memory.fix is not None
    assert "cgroup_enable=memory" in memory.fix
    assert findings["controller.cpu"].level == "ok"
    assert findings["kernel.cgroup_kill"].level == "warn"
    assert findings["kernel.cgroup_freeze"].level == "ok"


def test_ancestor_without_the_controller_in_subtree_control_is_named() -> None:
    findings = _by_topic(diagnose(_facts("cgroup2-full", "governor.slice/npu-chat")))
    cpu = findings["controller.cpu"]
    assert cpu.level == "warn"
    assert "governor.slice/cgroup.subtree_control" in cpu.message
    assert cpu.fix is not None
    assert "Delegate=yes" in cpu.fix
    assert findings["controller.memory"].level == "ok"


def test_scope_ancestor_gets_delegate_yes_fix() -> None:
    host = _facts("cgroup2-full", "governor.slice")
    scoped = replace(host, path=(replace(host.path[0], path="run-u7.scope"),))
    fix = _by_topic(diagnose(scoped))["controller.cpu"].fix
    assert fix == "set Delegate=yes on run-u7.scope so systemd leaves its subtree to governor"


def test_debian12_host_without_target_is_ok_and_all_alike() -> None:
    findings = _by_topic(diagnose(_facts("cgroup2-full")))
    assert all(f.level == "ok" for f in findings.values())
    assert findings["cpus.core_types"].message == "cpus = big/little unavailable: all CPUs alike"
    assert findings["systemd"].message == "systemd 252 is PID 1"


def test_needs_selects_the_controller_findings() -> None:
    findings = _by_topic(diagnose(_facts("no-psi"), needs=frozenset({"cpu", "pids"})))
    assert {t for t in findings if t.startswith("controller.")} == {
        "controller.cpu",
        "controller.pids",
    }


def test_kernel_just_at_the_gate_is_ok() -> None:
    host = replace(_facts("rk3588"), kernel_version=CGROUP_KILL_MIN)
    assert _by_topic(diagnose(host))["kernel.cgroup_kill"].level == "ok"


def test_unprivileged_user_and_offline_cpus_warn() -> None:
    host = replace(
        _facts("rk3588"),
        euid=1000,
        cpus_online=(0, 1, 2, 3, 4, 5),
        core_types=CoreTypes(little=(0, 1, 2, 3), big=(4, 5), source="cpu_capacity"),
    )
    findings = _by_topic(diagnose(host))
    assert findings["privileges"].level == "warn"
    assert findings["cpus.online"].level == "warn"
    assert "6-7" in findings["cpus.online"].message


def test_no_cgroup_at_all_is_an_error_with_a_mount_fix() -> None:
    host = replace(
        _facts("rk3588"), cgroup_layout="none", cgroup_mount=None, controllers=frozenset()
    )
    findings = _by_topic(diagnose(host))
    assert findings["cgroup2"].level == "error"
    assert findings["cgroup2"].fix is not None
    assert "mount -t cgroup2" in findings["cgroup2"].fix
    assert findings["controller.memory"].level == "error"


def test_a_5_10_kernel_names_each_late_feature_its_version_and_its_fallback() -> None:
    """A board's 5.10 (issue 37): every feature from a newer kernel is stated with the version
    it needs and what the governor does without it."""
    host = replace(_facts("rk3588"), kernel_version=(5, 10), kernel_release="5.10.160", euid=0)
    findings = _by_topic(diagnose(host))
    kill = findings["kernel.cgroup_kill"]
    assert kill.level == "warn" and "5.14+" in kill.message and "5.10.160" in kill.message
    assert "freezing the group and SIGKILL of each of its pids" in kill.message
    reclaim = findings["kernel.memory_reclaim"]
    assert reclaim.level == "warn" and "5.19+" in reclaim.message
    assert "lowering memory.high" in reclaim.message
    assert findings["kernel.madv_populate_read"].level == "warn"
    assert findings["kernel.memory_peak"].level == "warn"
    assert findings["kernel.clone_into_cgroup"].level == "ok"  # 5.7
    psi = findings["kernel.psi_unprivileged"]
    assert psi.level == "ok" and "6.5+" in psi.message  # root arms triggers on any kernel
    assert _by_topic(diagnose(replace(host, euid=1000)))["kernel.psi_unprivileged"].level == "warn"
    zswap = findings["kernel.zswap_writeback"]
    assert zswap.level == "ok" and "6.8+" in zswap.message
