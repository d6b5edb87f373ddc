"""probe() and the npu-chat plan against a real cgroup v2 kernel (kernel tier, in the guest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice

from governor.backends.cgroupfs import CgroupfsBackend
from governor.compile.compiler import compile_plan
from governor.kernel.cgroupfs import CgroupFs
from governor.plan.host import CoreTypes, probe
from governor.policy.loader import load
from governor.record import replace

CORE = ("cpuset", "cpu", "io", "memory", "pids")
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.kernel(controllers=CORE, root=True, psi=True)


def test_probe_reports_unified_cgroup2_with_controllers_and_psi() -> None:
    host = probe()
    assert host.cgroup_layout == "unified"
    assert host.cgroup_mount == "/sys/fs/cgroup"
    assert set(CORE) <= host.controllers
    assert host.psi is True
    assert host.kernel_version >= (5, 14)
    assert len(host.cpus_online) >= 2
    assert host.euid == 0


def test_npu_chat_plan_writes_read_back_as_planned(
    scratch_slice: ScratchSlice, empty_root_subtree: Path
) -> None:
    policy = load(REPO / "policies" / "npu-chat.toml").model_copy(
        update={"slice": scratch_slice.name}
    )
    host = probe(target=f"{scratch_slice.name}/{policy.name}")
    # the guest's vCPUs are all alike: give it the RK3588's two clusters on 4 CPUs so that
    # cpus = "big" resolves (the real board reads them from cpu_capacity)
    online = host.cpus_online
    host = replace(
        host,
        core_types=CoreTypes(
            little=online[: len(online) // 2],
            big=online[len(online) // 2 :],
            source="cpu_capacity",
        ),
    )
    plan = compile_plan(policy, host)
    fs = CgroupFs(Path(plan.cgroup_root))
    backend = CgroupfsBackend(fs)
    backend.apply(plan)
    try:
        for w in plan.writes:
            live = cgroups.read(Path(plan.cgroup_root) / w.cgroup / w.file)
            assert live == w.value, f"{w.file}: planned {w.value!r}, kernel reads {live!r}"
        assert all(obs.matches for obs in backend.observe(plan))
        high = next(w for w in plan.writes if w.file == "memory.high")
        assert int(high.value) % host.page_size == 0
        cpus = next(w for w in plan.writes if w.file == "cpuset.cpus")
        assert cpus.value == cgroups.read(Path(plan.cgroup_root) / plan.group / "cpuset.cpus")
    finally:
        backend.remove(plan)
    assert not (scratch_slice.path / policy.name).exists()


def _kernel_config() -> dict[str, str]:
    """The running kernel's build config: /boot's (the kernel tier; the arm64 root file system,
    scripts/arm64-setup) or scripts/kernels' cache (the compat tiers: GOVERNOR_KERNELS_DIR, as
    the script reads it), both on the host's root the guest boots."""
    release = os.uname().release
    kernels = Path(os.environ.get("GOVERNOR_KERNELS_DIR", "/var/lib/governor/kernels"))
    cands = [Path(f"/boot/config-{release}"), *kernels.glob(f"*/config-{release}")]
    for c in cands:
        if c.is_file():
            pairs = (ln.split("=", 1) for ln in c.read_text().splitlines() if "=" in ln)
            return {k: v for k, v in pairs if not k.startswith("#")}
    pytest.fail(f"no build config of {release} in {[str(c) for c in cands]}")


@pytest.mark.compat
def test_doctor_reports_the_multigen_lru_as_the_kernel_was_built() -> None:
    """issue 47: Debian's 6.12 and later boot with MGLRU on (0x0007), its 6.1 builds it off,
    5.10 has none; doctor's finding follows the kernel's own switch."""
    config = _kernel_config()
    res = subprocess.run([sys.executable, "-m", "governor", "doctor", "--json"],
                         capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    found = {f["topic"]: f for f in json.loads(res.stdout)["findings"]}
    message = found["mglru"]["message"]
    if config.get("CONFIG_LRU_GEN") != "y":
        assert message.startswith("no multi-gen LRU in this kernel"), message
    elif config.get("CONFIG_LRU_GEN_ENABLED") == "y":
        assert message.startswith("multi-gen LRU on (0x"), message  # 0x0007 on 6.18
        assert "min_ttl_ms 0: no working set is protected" in message, message
    else:
        assert message.startswith(
            "multi-gen LRU built but off (/sys/kernel/mm/lru_gen/enabled 0x0000)"
        ), message


def _release() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int(minor)


@pytest.mark.compat
def test_doctor_probes_peak_reset_and_reclaim_swappiness_by_writing(
    scratch_slice: ScratchSlice, enabled_root_subtree: Path
) -> None:
    """issue 47: memory.peak reset (6.12) and memory.reclaim swappiness= (6.11) are found by a
    harmless write (governor/kernel/writeprobe.py); each kernel of the matrix answers as its
    version says (5.10 has no memory.reclaim at all)."""
    scratch_slice.create()  # a group with memory.peak (the root has none)
    res = subprocess.run([sys.executable, "-m", "governor", "doctor", "--json"],
                         capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    found = {f["topic"]: f["message"] for f in json.loads(res.stdout)["findings"]}
    peak, swappiness = found["kernel.memory_peak_reset"], found["kernel.reclaim_swappiness"]
    release = _release()
    assert ("the kernel took a write" in peak) == (release >= (6, 12)), peak
    if release >= (5, 19):
        assert ("the kernel took a write" in swappiness) == (release >= (6, 11)), swappiness
        assert ("refused" in swappiness) == (release < (6, 11)), swappiness
    else:
        assert "unknown (no memory.reclaim" in swappiness, swappiness
    if release < (6, 12):  # refused before 6.12 (5.10 has no memory.peak: unknown)
        assert ("refused" in peak) == (release >= (5, 19)), peak


def _touch_in(group: Path, mib: int) -> None:
    """A process in ``group`` that touches ``mib`` MiB of anonymous memory and exits."""
    code = f"b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096])"
    script = f'echo $$ > {group}/cgroup.procs && exec {sys.executable} -c "{code}"'
    subprocess.run(["sh", "-c", script], check=True, timeout=120)


@pytest.mark.compat
def test_the_samplers_run_peak_starts_again_at_a_reset(
    scratch_slice: ScratchSlice, enabled_root_subtree: Path
) -> None:
    """issue 47: on 6.12+ the sampler's reset fd sees only the peak after the reset (a restart's
    own peak in the same group); before, the kernel refuses and run_peak is None."""
    from governor.monitor.sampler import Sampler

    group = scratch_slice.create()
    _touch_in(group, 192)
    s = Sampler(CgroupFs(Path("/sys/fs/cgroup")), scratch_slice.name)
    try:
        took = s.reset_peak()
        _touch_in(group, 16)
        got = s.sample(1.0)
    finally:
        s.close()
    assert took == (_release() >= (6, 12))
    if _release() < (5, 19):
        assert got.peak is None and got.run_peak is None
        return
    assert got.peak is not None and got.peak >= 192 << 20, got
    if took:
        # the reset starts from memory.current (the first run's page cache stays charged)
        assert got.run_peak is not None and 16 << 20 <= got.run_peak < 128 << 20, got
    else:
        assert got.run_peak is None
