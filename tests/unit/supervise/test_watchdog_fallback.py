"""The /bin/sh watchdog (governor/supervise/watchdog.py) on a kernel without cgroup.kill
(before 5.14: a board's 5.10): at the governor's death it freezes the group, SIGKILLs every
pid of every cgroup.procs below it until none is left, and thaws it.

Needs: /bin/sh and a tmp directory standing in for cgroupfs. Its cgroup.procs are regular
files, so the test plays the kernel's part: once the process listed there died, it empties
cgroup.procs and sets cgroup.events to "populated 0". The process is the test's own child.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from governor.supervise.watchdog import fork_watchdog

WAIT_S = 20.0


def _tree(root: Path, *, has_kill: bool) -> tuple[Path, Path]:
    group = root / "gov.slice" / "eng"
    leaf = group / "leaf"
    leaf.mkdir(parents=True)
    for d in (group, leaf):
        (d / "cgroup.procs").write_text("")
        (d / "cgroup.freeze").write_text("0\n")
        (d / "cgroup.events").write_text("populated 1\nfrozen 0\n")
        if has_kill:
            (d / "cgroup.kill").write_text("")
    return group, leaf


def _wait_exit(proc: subprocess.Popen[bytes]) -> int | None:
    try:
        return proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        return None


def test_without_cgroup_kill_the_watchdog_sigkills_each_pid_of_the_group(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    group, leaf = _tree(tmp_path, has_kill=False)
    # stands for the engine's own child, which PR_SET_PDEATHSIG does not reach
    engine = subprocess.Popen(["sleep", "300"])
    try:
        (leaf / "cgroup.procs").write_text(f"{engine.pid}\n")
        wd = fork_watchdog()
        wd.arm(str(tmp_path), "gov.slice/eng", ("gov.slice/eng/leaf", "gov.slice/eng"))
        assert wd.fd is not None
        os.close(wd.fd)  # the governor died: the pipe's only writer is gone
        wd.fd = None
        rc = _wait_exit(engine)
        assert rc == -signal.SIGKILL, "the watchdog did not kill the engine's process"
        # the kernel's part: the process left, the group is empty
        (leaf / "cgroup.procs").write_text("")
        for d in (group, leaf):
            (d / "cgroup.events").write_text("populated 0\nfrozen 0\n")
        deadline = time.monotonic() + WAIT_S
        while os.waitpid(wd.pid, os.WNOHANG) == (0, 0):
            assert time.monotonic() < deadline, "the watchdog did not exit"
            time.sleep(0.05)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    # thawed again after the kill; no cgroup.kill file created where the kernel has none
    assert (group / "cgroup.freeze").read_text().strip() == "0"
    assert not (group / "cgroup.kill").exists()
    events = [json.loads(ln) for ln in capfd.readouterr().err.splitlines() if ln.startswith("{")]
    kills = [e for e in events if e.get("action") == "kill"]
    assert kills == [{"event": "watchdog.governor_gone", "action": "kill",
                      "cgroup": "gov.slice/eng", "fallback": "sigkill",
                      "level": "warning"}]  # fmt: skip


def test_with_cgroup_kill_the_watchdog_writes_it_and_signals_no_pid(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    group, leaf = _tree(tmp_path, has_kill=True)
    engine = subprocess.Popen(["sleep", "300"])
    try:
        (leaf / "cgroup.procs").write_text(f"{engine.pid}\n")
        for d in (group, leaf):
            (d / "cgroup.events").write_text("populated 0\nfrozen 0\n")
        wd = fork_watchdog()
        wd.arm(str(tmp_path), "gov.slice/eng", ())
        assert wd.fd is not None
        os.close(wd.fd)
        wd.fd = None
        os.waitpid(wd.pid, 0)
        assert (group / "cgroup.kill").read_text() == "1\n"
        assert engine.poll() is None  # cgroup.kill is the kernel's job: no pid was signalled
        assert (group / "cgroup.freeze").read_text().strip() == "0"
    finally:
        engine.kill()
        engine.wait()
    assert '"fallback"' not in capfd.readouterr().err
