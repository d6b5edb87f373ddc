"""[clocks] in the real launch sequence (kernel tier, in the guest): the guest has no cpufreq or
devfreq, so the clocks are a copy of the rk3588 fixture's tree on the guest's tmpfs
(--sysfs-root); the cgroups are real. A launch with memory limits and [clocks] sets both, and
after a SIGKILL of the governor the watchdog kills the group, removes it and restores every
clock file exactly. A refused re-`apply` (its [clocks] changed while the first apply holds them) kills
nothing: the process in the slice runs on, the group and the clock ledger stay.

Needs: root, cgroup2 with the memory controller, cgroup.kill (5.14), /bin/sh."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice
from helpers.clocks import DMC, POLICY4, board, read, snapshot

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.kernel(controllers=("memory",), root=True)
def test_sigkill_of_the_governor_restores_the_clocks_and_removes_the_group(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    sysfs = board(tmp_path)
    before = snapshot(sysfs)
    policy = tmp_path / "clk.toml"
    policy.write_text(
        f'name = "clk"\nslice = "{scratch_slice.name}"\n[memory]\nmax = "64M"\n'
        '[clocks]\nbig = { governor = "userspace", min = "max" }\ndmc = "performance"\n'
    )
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(tmp_path / "run")}
    argv = [sys.executable, "-m", "governor", "--sysfs-root", str(sysfs), "launch"]
    p = subprocess.Popen(
        [*argv, "--policy", str(policy), "--", "sleep", "300"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    group = scratch_slice.path / "clk"
    try:
        cgroups.wait_for(
            lambda: (group / "engine").is_dir() and cgroups.pids(group / "engine"),
            120,
            "the engine in its leaf",
            interval=0.1,
        )
        assert cgroups.read(group / "memory.max") == str(64 << 20)
        assert read(sysfs, POLICY4, "scaling_governor") == "userspace"
        assert read(sysfs, POLICY4, "scaling_min_freq") == "2352000"
        assert read(sysfs, DMC, "governor") == "performance"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        cgroups.wait_for(lambda: not group.exists(), 60, "the watchdog to remove the group")
        cgroups.wait_for(lambda: snapshot(sysfs) == before, 60, "the watchdog's clock restore")
    finally:
        if p.poll() is None:
            p.kill()
        _, err = p.communicate(timeout=120)
    assert "restore clocks" in err
    assert not (tmp_path / "run" / "clocks.json").exists()


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
    )


@pytest.mark.kernel(controllers=("memory",), root=True)
def test_a_refused_reapply_leaves_the_running_slice_and_its_clocks(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    sysfs = board(tmp_path)
    policy = tmp_path / "ra.toml"
    body = f'name = "ra"\nslice = "{scratch_slice.name}"\n[memory]\nhigh = "64M"\n[clocks]\n'
    policy.write_text(body + 'dmc = "performance"\n')
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(tmp_path / "run")}
    argv = [sys.executable, "-m", "governor", "--sysfs-root", str(sysfs), "apply", str(policy)]
    first = _run(argv, env)
    assert first.returncode == 0, first.stderr
    group = scratch_slice.path / "ra"
    work = cgroups.start_in_cgroup(group / "engine", ["sleep", "300"])
    try:
        ledger = (tmp_path / "run" / "clocks.json").read_text()
        state = (tmp_path / "run" / "ra" / "state.json").read_text()
        policy.write_text(body.replace("64M", "32M") + 'dmc = "powersave"\n')
        again = _run(argv, env)
        assert again.returncode == 65, again.stderr
        assert "held by policy ra (governor apply)" in again.stderr
        assert work.poll() is None, "the refused apply killed the slice's process"
        assert cgroups.pids(group / "engine") == [work.pid]
        assert cgroups.read(group / "memory.high") == str(64 << 20)  # its write rolled back
        assert read(sysfs, DMC, "governor") == "performance"
        assert (tmp_path / "run" / "clocks.json").read_text() == ledger
        assert (tmp_path / "run" / "ra" / "state.json").read_text() == state
    finally:
        work.kill()
        work.wait()
