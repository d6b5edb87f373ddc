"""Issue 14's hardening on a real cgroup v2 kernel (kernel tier, in the guest).

- What the engine inherits across the real clone3(CLONE_INTO_CGROUP) start: no fd beyond 0-2
  (a root-only file held open by the shell that ran the governor), default signal dispositions
  and an empty mask, while it runs as process.user.
- A SIGTERM in every phase of a launch (before Python ran, planned, inside the apply, the engine
  exec'd but not yet supervised, supervised), each landing proven by what the governor had
  written when it was stopped, leaves no cgroup and no limit behind.
- `governor monitor` attached to a slice arms a thaw: SIGKILLed while the group is frozen, the
  group is thawed by its watchdog.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


PIPE_SIZE = 4096  # F_SETPIPE_SZ's floor (one page): a full pipe blocks the governor's next line
F_SETPIPE_SZ = 1031  # <linux/fcntl.h>
FIONREAD = 0x541B  # <asm-generic/ioctls.h>


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe behind read end `fd`."""
    buf = array.array("i", [0])
    fcntl.ioctl(fd, FIONREAD, buf, True)
    return buf[0]


def _blocked_writing_stderr(pid: int) -> bool:
    """`pid` sleeps in write(2) on fd 2 (/proc/PID/syscall: number and arguments)."""
    try:
        words = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return len(words) > 1 and words[0] == "1" and int(words[1], 16) == 2


def _catches(pid: int, sig: int) -> bool:
    """`pid` has a handler for `sig` (SigCgt in /proc/PID/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def _records(lines: list[str]) -> list[dict[str, Any] | str]:
    """stderr lines as JSON records (the structured log) or plain text (governor: ... lines)."""
    return [json.loads(ln) if ln.startswith("{") else ln for ln in lines]


def _event(rec: dict[str, Any] | str) -> str:
    return rec.get("event", "?") if isinstance(rec, dict) else rec.split(" ", 2)[1]


class _Drain:
    """Read a pipe to its end in a thread (the governor must be able to finish writing)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.data = fd, bytearray()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while chunk := os.read(self.fd, 65536):
            self.data += chunk
        os.close(self.fd)

    def text(self, timeout: float = 120) -> str:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "stderr still open"
        return self.data.decode(errors="replace")


@pytest.mark.kernel(controllers=ALL, root=True)
def test_a_sigterm_at_any_moment_of_a_launch_leaves_nothing_behind(
    tmp_path: Path, scratch_slice: ScratchSlice, enabled_root_subtree: Path
) -> None:
    """A SIGTERM in each phase of a launch, each landing proven by the governor's own stderr:
    the governor is stopped by the test INSIDE a phase (its stderr is a one-page pipe filled so
    that the line that follows a given step cannot be written: the process sleeps in write(2)
    right after that step), the kernel state of that moment is checked, then it gets SIGTERM.
    The bytes it had written before the signal (the pipe's fill level) name the lines, hence
    the steps, that were done. Phases: before Python ran, planned (announced, nothing applied),
    apply (group created, nothing written), apply (one limit written, the next not logged),
    engine exec'd but not yet supervised (held, then forwarded to the engine), supervised."""
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
    slice_ = scratch_slice.create()
    # the slice offers its controllers already: every run's apply logs the same lines
    cgroups.set_subtree_control(slice_, ["memory", "pids"], True)
    group = slice_ / "trm"
    before = sorted(p.name for p in slice_.iterdir())
    min_before = cgroups.read(slice_ / "memory.min")
    argv = _governor("launch", "--policy", str(policy), "--", "sleep", "30")

    def nothing_left(phase: str, slice_min: str | None = None) -> None:
        cgroups.wait_for(lambda: not group.exists(), 60, f"no group after a SIGTERM ({phase})")
        assert sorted(p.name for p in slice_.iterdir()) == before, phase
        assert cgroups.read(slice_ / "memory.min") == (slice_min or min_before), phase

    # 1. before Python ran: signalled right after the fork, nothing was written
    early = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    early.send_signal(signal.SIGTERM)
    _, err = early.communicate(timeout=120)
    assert early.returncode == -signal.SIGTERM and err == b"", (early.returncode, err[-1500:])
    nothing_left("before Python ran")

    # 2. supervised: the engine started (its line read) and the governor's forwarder installed
    # (a SIGTERM handler again: the apply's was removed before the start), the signal goes to
    # the engine. This run's lines are also the map of the launch (what the runs below aim at)
    gov = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert gov.stderr is not None
    lines: list[str] = []
    for line in gov.stderr:
        lines.append(line)
        if '"engine.started"' in line:
            cgroups.wait_for(
                lambda: _catches(gov.pid, signal.SIGTERM), 120, "the signal forwarder",
                interval=0.05,
            )  # fmt: skip
            gov.send_signal(signal.SIGTERM)
            break
    _, rest = gov.communicate(timeout=120)
    assert gov.returncode == 143, (lines, rest)
    assert '"signal.forwarded"' in rest, rest[-2000:]
    nothing_left("supervised")
    launch = _records(lines)
    events = [_event(r) for r in launch]
    print("the launch's lines:", events)

    def first(pred: Callable[[dict[str, Any] | str], bool]) -> int:
        return next(i for i, r in enumerate(launch) if pred(r))

    def is_write(r: dict[str, Any] | str) -> bool:
        return isinstance(r, dict) and r.get("event") == "cgroup.write"

    w0 = first(is_write)
    mkdir = first(lambda r: isinstance(r, dict) and r.get("event") == "cgroup.mkdir")
    first_write = launch[w0]
    assert isinstance(first_write, dict)
    started = events.index("engine.started")
    assert 0 < mkdir < w0 < started, events

    gov_pid = [0]

    def blocked_at(
        k: int, phase: str, check: Callable[[], None], slice_min: str | None = None
    ) -> tuple[int, str]:
        """Run the launch until it sleeps writing line k, check(), SIGTERM; (status, stderr)."""
        r, w = os.pipe()
        fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_SIZE)
        prefix = sum(len(ln.encode()) for ln in lines[:k])
        filler = PIPE_SIZE - prefix
        assert filler >= 1, f"lines before #{k} exceed a pipe page ({prefix} bytes)"
        os.write(w, b"#" * (filler - 1) + b"\n")
        gov = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=w)
        gov_pid[0] = gov.pid
        os.close(w)
        seen = [-1]

        def asleep() -> bool:  # in write(2) on its stderr, twice in a row with the same fill
            level = _unread(r) if _blocked_writing_stderr(gov.pid) else -1
            steady, seen[0] = level >= 0 and level == seen[0], level
            return steady

        try:
            cgroups.wait_for(
                asleep, 120, f"the governor to block writing line #{k} ({phase})", interval=0.1
            )
            written = _unread(r) - filler
            assert written == prefix, (phase, written, prefix)  # lines[:k] and nothing more
            check()
            gov.send_signal(signal.SIGTERM)
        finally:
            drain = _Drain(r)
            rc = gov.wait(timeout=120)
        out = drain.text().split("\n", 1)[1]
        done = _records(out.encode()[:prefix].decode().splitlines())
        assert [_event(x) for x in done] == events[:k], (phase, out[:3000])
        assert "Traceback" not in out, out[-3000:]
        nothing_left(phase, slice_min)
        # signalled outside the apply the default action ends it; inside, the rollback (143)
        assert rc in (-signal.SIGTERM, 143), (phase, rc, out[-2000:])
        return rc, out

    def group_absent() -> None:
        assert not group.exists(), "the group exists before the apply"

    # 3. planned: blocked announcing where the engine will run; nothing exists yet
    _, out = blocked_at(0, "planned", group_absent)
    assert not [x for x in _records(out.splitlines()) if _event(x) == "cgroup.mkdir"], out

    def created_bare() -> None:
        assert group.is_dir() and cgroups.read(group / "memory.max") == "max"

    # 4. apply: the group made, no limit written yet; the stop is rolled back (143)
    rc, out = blocked_at(mkdir, "apply: group created", created_bare)
    assert rc == 143, out
    assert "interrupted by SIGTERM: the limits applied so far were rolled back" in out, out

    def one_written() -> None:
        cg = scratch_slice.root / str(first_write["cgroup"]).lstrip("/")
        assert cgroups.read(cg / str(first_write["file"])) == str(first_write["value"])
        assert not (group / "engine").exists() or not cgroups.pids(group / "engine")

    # 5. apply: the first limit written, blocked logging it; nothing runs in the leaf
    rc, out = blocked_at(w0, "apply: a limit written", one_written)
    assert rc == 143, out
    assert "interrupted by SIGTERM: the limits applied so far were rolled back" in out, out

    def engine_running() -> None:
        assert cgroups.pids(group / "engine"), "no engine in the leaf"
        assert _catches(gov_pid[0], signal.SIGTERM), "nothing holds a stop signal here"

    # 6. the engine exec'd, the governor blocked logging it before it supervises: the forwarder
    # installed since the apply's end holds the SIGTERM and forwards it once the engine runs
    # (launch/launcher.py Forwarder); the engine ends by it, the governor reports 143 and
    # removes everything like after any run (the slice's memory.min back to what it was)
    rc, out = blocked_at(started, "engine exec'd, not supervised", engine_running)
    assert rc == 143, out[-2000:]
    events_after = [_event(x) for x in _records(out.splitlines())]
    assert "signal.held" in events_after and "signal.forwarded" in events_after, events_after


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
