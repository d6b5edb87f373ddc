"""Issue 14's hardening on a real cgroup v2 kernel (kernel tier, in the guest).

- What the engine inherits across the real clone3(CLONE_INTO_CGROUP) start: no fd beyond 0-2
  (a root-only file held open by the shell that ran the governor), default signal dispositions
  and an empty mask, while it runs as process.user.
- A SIGTERM at any moment of a launch (before, during or after the apply) leaves no cgroup
  and no limit behind, and the governor exits 143 (or with the engine's status).
- `governor monitor` attached to a slice arms a thaw: SIGKILLed while the group is frozen, the
  group is thawed by its watchdog.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice

REPO = Path(__file__).resolve().parents[2]
ALL = ("memory", "cpu", "cpuset", "io", "pids")


def _governor(*args: str) -> list[str]:
    return [sys.executable, "-m", "governor", *args]


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


def _policy(tmp_path: Path, slice_: ScratchSlice, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nslice = "{slice_.name}"\n' + textwrap.dedent(body))
    path.chmod(0o644)
    return path


@pytest.mark.kernel(controllers=ALL, root=True)
def test_the_engine_inherits_no_fd_and_default_signals_across_the_real_start(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    # the engine runs as nobody: it writes its findings where nobody can (pytest's own tmp
    # directories are 0700 root)
    shared = Path(tempfile.mkdtemp(prefix="governor-inh-"))
    shared.chmod(0o777)
    out = shared / "out"
    policy = _policy(
        tmp_path,
        scratch_slice,
        "inh",
        """
        [memory]
        max = "200M"
        [process]
        user = "nobody"
        """,
    )
    engine = (
        f"ls -l /proc/self/fd/ > {out}; grep -E '^Sig(Ign|Blk):' /proc/self/status >> {out};"
        f" cat /proc/self/fd/9 >> {out} 2>&1; id -un >> {out}"
    )
    # the operator's shell holds fd 9 on a root-only file, as `9</etc/shadow` would
    script = f'exec 9<{secret}; exec {" ".join(_governor("launch", "--policy", str(policy)))} -- /bin/sh -c "{engine}"'
    done = subprocess.run(
        ["/bin/sh", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        text = out.read_text()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    print(text)
    assert str(secret) not in text, "the engine inherited the shell's fd 9"
    assert "root only" not in text
    assert "SigIgn:\t0000000000000000" in text, "signals ignored in the engine"
    assert "SigBlk:\t0000000000000000" in text, "signals blocked in the engine"
    assert text.strip().splitlines()[-1] == "nobody"


@pytest.mark.kernel(controllers=ALL, root=True)
def test_a_sigterm_at_any_moment_of_a_launch_leaves_nothing_behind(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    policy = _policy(
        tmp_path,
        scratch_slice,
        "trm",
        """
        [memory]
        min = "16M"
        high = "150M"
        max = "200M"
        [pids]
        max = 64
        """,
    )
    scratch_slice.create()
    before = sorted(p.name for p in scratch_slice.path.iterdir())
    min_before = cgroups.read(scratch_slice.path / "memory.min")
    codes = []
    # from "still starting Python" to "engine running": every phase of the launch once
    for delay in (0.3, 0.8, 1.2, 1.6, 2.0, 2.5, 3.0, 4.0, 6.0):
        gov = subprocess.Popen(
            _governor("launch", "--policy", str(policy), "--", "sleep", "30"),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(delay)
        gov.send_signal(signal.SIGTERM)
        _, err = gov.communicate(timeout=120)
        codes.append(gov.returncode)
        assert "Traceback" not in err, err[-2000:]
        assert gov.returncode in (143, -signal.SIGTERM), (delay, gov.returncode, err[-1500:])
        cgroups.wait_for(
            lambda: not (scratch_slice.path / "trm").exists(), 30, f"no group after {delay}s"
        )
        assert sorted(p.name for p in scratch_slice.path.iterdir()) == before
        assert cgroups.read(scratch_slice.path / "memory.min") == min_before
    print(f"exit codes by delay: {codes}")


@pytest.mark.kernel(controllers=("memory", "pids"), root=True)
def test_a_sigkilled_monitor_leaves_no_frozen_group(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    policy = _policy(
        tmp_path,
        scratch_slice,
        "frz",
        """
        [memory]
        max = "200M"
        [[pressure]]
        when = "memory some 150ms/2s"
        do = ["freeze 10s"]
        """,
    )
    applied = subprocess.run(
        _governor("apply", str(policy)), cwd=REPO, capture_output=True, text=True, timeout=240,
        check=False,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    group = scratch_slice.path / "frz"
    sleeper = cgroups.start_in_cgroup(group / "engine", ["sleep", "120"])
    monitor = subprocess.Popen(
        _governor("monitor", str(policy)),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # its watchdog (a /bin/sh child) is forked and armed before the monitor loop starts
        cgroups.wait_for(lambda: _children(monitor.pid), 240, "the monitor's watchdog")
        time.sleep(1.0)
        (group / "cgroup.freeze").write_text("1")  # as its freeze action would
        cgroups.wait_for(
            lambda: cgroups.read_kv(group / "cgroup.events")["frozen"] == 1, 30, "frozen"
        )
        monitor.kill()
        monitor.wait(timeout=30)
        cgroups.wait_for(
            lambda: cgroups.read_kv(group / "cgroup.events")["frozen"] == 0,
            30,
            "the monitor's watchdog to thaw the group",
        )
        assert sleeper.poll() is None, "a thaw, not a kill"
    finally:
        sleeper.kill()
        sleeper.wait()
        if monitor.poll() is None:
            monitor.kill()
        subprocess.run(_governor("remove", str(policy)), cwd=REPO, capture_output=True, check=False)
