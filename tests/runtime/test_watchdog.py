"""The /bin/sh watchdog (governor/supervise/watchdog.py) with a real governor: SIGKILL of the
governor kills the whole group (cgroup.kill reaches the engine's own children, which
PR_SET_PDEATHSIG does not) and removes the group, the leaf and the supervisor's published
state; a normal exit disarms it and reaps
it; it is small (PSS, a documented bound: a shell, not a copy of the interpreter); with
on_governor_exit = "keep" it is never armed.

Needs what tests/runtime/conftest.py says, plus cgroup.kill (Linux 5.14) in the scratch slice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cgroups
from vm import requirements

from .conftest import Governor, Run

WAIT_S = 10  # the watchdog waits up to 5 s for "populated 0"; then rmdir
PSS_BOUND_KIB = 2048  # dash/busybox sh: ~300 KiB; a fork of the interpreter: 5+ MiB
# the engine: a shell whose background sleep only cgroup.kill can reach (pdeathsig is the sh's)
ENGINE = ("/bin/sh", "-c", 'sleep 60 & echo $! > "$0"; wait')


@pytest.fixture
def with_cgroup_kill(governor: Governor) -> None:
    if not (governor.slice.create() / "cgroup.kill").exists():
        requirements.enforce(["no cgroup.kill in a cgroup2 directory (needs Linux 5.14)"])


def _dead(pid: int) -> bool:
    """Gone, or a zombie (its parent has not reaped it yet: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _engine_running(governor: Governor, pid_file: Path) -> int:
    """Wait until the engine's background sleep is in the leaf; its pid."""

    def ready() -> int | None:
        if not pid_file.exists() or not pid_file.read_text().strip():
            return None
        pid = int(pid_file.read_text())
        return pid if governor.leaf.is_dir() and pid in cgroups.pids(governor.leaf) else None

    return cgroups.wait_for(ready, 30, "the engine's sleep in the leaf", interval=0.05)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _watchdog_of(governor_pid: int) -> int:
    """The governor's child running the watchdog script (exec'd /bin/sh)."""
    for pid in _children(governor_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[:2] == [b"/bin/sh", b"-c"] and b"watchdog.governor_gone" in cmdline[2]:
            return pid
    raise AssertionError(f"no watchdog among the children of {governor_pid}")


def test_sigkill_of_the_governor_kills_the_group_and_removes_group_leaf_and_state(
    governor: Governor, with_cgroup_kill: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "sleep.pid"
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(tmp_path / "run"))
    state = tmp_path / "run" / "rt" / "state.json"
    proc = governor.start(governor.policy(), (*ENGINE, str(pid_file)))
    try:
        sleep_pid = _engine_running(governor, pid_file)
        cgroups.wait_for(state.exists, WAIT_S, "the supervisor to publish its state")
        assert json.loads(state.read_text())["pid"] == proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        cgroups.wait_for(
            lambda: not governor.group.exists(), WAIT_S, "the watchdog to remove the group"
        )
        assert not governor.leaf.exists()
        cgroups.wait_for(lambda: _dead(sleep_pid), WAIT_S, "the engine's sleep to die")
        # the published state of the dead supervisor is gone too: status lists nothing stale
        cgroups.wait_for(lambda: not state.parent.exists(), WAIT_S, "the state to be removed")
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=60)  # EOF once the watchdog has exited
    gone = [e for e in Run(-9, "", err).events if e["event"] == "watchdog.governor_gone"]
    assert [e["cgroup"] for e in gone] == [f"{governor.slice.name}/rt"]


# runs the governor as a child subreaper: whatever the governor leaves running or unreaped
# (an undisarmed watchdog) becomes this process's child and is found by waitpid(-1)
_SUBREAPER = """
import ctypes, json, os, subprocess, sys
PR_SET_CHILD_SUBREAPER = 36
if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
run = subprocess.run(json.loads(sys.argv[1]), stdin=subprocess.DEVNULL, capture_output=True, text=True)
try:
    left = os.waitpid(-1, os.WNOHANG)  # (0, 0): a live orphan; (pid, status): an unreaped one
except ChildProcessError:
    left = None  # no orphan at all
print(json.dumps({"code": run.returncode, "stderr": run.stderr, "left": left}))
"""


def test_a_normal_exit_disarms_the_watchdog_and_reaps_it(governor: Governor) -> None:
    argv = [sys.executable, "-m", "governor", *governor.args(governor.policy(), ["/bin/true"])]
    out = subprocess.run(
        [sys.executable, "-c", _SUBREAPER, json.dumps(argv)],
        cwd=governor.workdir,
        env=governor.env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout)
    run = Run(result["code"], "", result["stderr"])
    assert run.code == 0, run.stderr
    assert run.has("engine.exit")  # the supervisor ran (the watchdog was armed)
    assert not run.has("watchdog.governor_gone")
    assert result["left"] is None
    assert not governor.group.exists()


def test_the_armed_watchdog_is_a_small_shell(governor: Governor, tmp_path: Path) -> None:
    pid_file = tmp_path / "sleep.pid"
    proc = governor.start(governor.policy(), (*ENGINE, str(pid_file)))
    try:
        _engine_running(governor, pid_file)
        rollup = Path(f"/proc/{_watchdog_of(proc.pid)}/smaps_rollup").read_text()
        (pss_kib,) = [
            int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")
        ]
        assert pss_kib < PSS_BOUND_KIB
        proc.send_signal(signal.SIGTERM)  # forwarded to the engine; the governor cleans up
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=60)
    assert not Run(proc.returncode, "", err).has("watchdog.governor_gone")


def test_with_on_governor_exit_keep_the_watchdog_is_not_armed(
    governor: Governor, tmp_path: Path
) -> None:
    pid_file = tmp_path / "sleep.pid"
    policy = governor.policy('[process]\non_governor_exit = "keep"\n')
    proc = governor.start(policy, (*ENGINE, str(pid_file)))
    try:
        sleep_pid = _engine_running(governor, pid_file)
        watchdog = _watchdog_of(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # once the watchdog has read EOF and exited, whatever it was going to do is done
        cgroups.wait_for(lambda: _dead(watchdog), WAIT_S, "the watchdog to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
        # the engine holds the governor's pipes open: close them rather than wait for EOF
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    # the engine outlives the governor in its group (the scratch slice's teardown kills it)
    assert not _dead(sleep_pid)
    assert sleep_pid in cgroups.pids(governor.leaf)


def test_an_armed_thaw_thaws_the_group_when_the_monitor_dies(
    scratch_slice: cgroups.ScratchSlice,
) -> None:
    """`governor monitor` (attach mode) arms a thaw: a freeze action must not outlive a monitor
    that is SIGKILLed or OOM-killed. Simulated here by closing the governor's end of the pipe,
    which is what the kernel does when the process dies."""
    from governor.supervise.watchdog import fork_watchdog

    group = scratch_slice.create()
    if not (group / "cgroup.freeze").exists():
        requirements.enforce(["no cgroup.freeze in a cgroup2 directory (needs Linux 5.2)"])
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (group / "cgroup.procs").write_text(str(sleeper.pid))
        (group / "cgroup.freeze").write_text("1")
        cgroups.wait_for(
            lambda: cgroups.read_kv(group / "cgroup.events").get("frozen") == 1, 10, "frozen"
        )
        watchdog = fork_watchdog()
        watchdog.arm_thaw(str(scratch_slice.root), scratch_slice.name)
        assert watchdog.fd is not None
        os.close(watchdog.fd)  # the governor's death, as the kernel sees it
        watchdog.fd = None
        os.waitpid(watchdog.pid, 0)
        assert cgroups.read(group / "cgroup.freeze") == "0"
        cgroups.wait_for(
            lambda: cgroups.read_kv(group / "cgroup.events").get("frozen") == 0, 10, "thawed"
        )
        assert sleeper.poll() is None, "a thaw only: the process still runs"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_disarmed_thaw_leaves_the_group_alone(scratch_slice: cgroups.ScratchSlice) -> None:
    from governor.supervise.watchdog import fork_watchdog

    group = scratch_slice.create()
    if not (group / "cgroup.freeze").exists():
        requirements.enforce(["no cgroup.freeze in a cgroup2 directory (needs Linux 5.2)"])
    (group / "cgroup.freeze").write_text("1")
    watchdog = fork_watchdog()
    watchdog.arm_thaw(str(scratch_slice.root), scratch_slice.name)
    watchdog.disarm()
    assert cgroups.read(group / "cgroup.freeze") == "1"
    (group / "cgroup.freeze").write_text("0")
