"""A lock another process may hold (issue 43 item 2): taken against the caller's deadline, never
blocking past it, naming the holder from the pid it wrote; a lock file that is a symlink or a
FIFO is refused, not followed. The holders are real processes (a POSIX lock is per process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.peer.files import CappedReadError
from governor.peer.lock import LockBusy, holder, take

# takes the lock with governor's take() (its pid in the file), or with a bare lockf (none)
_HOLDER = """
import fcntl, os, sys, time
from pathlib import Path
from governor.peer.lock import take
if sys.argv[2] == "take":
    fd = take(Path(sys.argv[1]), deadline=time.monotonic())
else:
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


def _hold(path: Path, how: str = "take") -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), how],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    return child


@pytest.fixture
def held(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    child = _hold(tmp_path / "board.lock")
    yield child
    assert child.stdin is not None
    child.stdin.close()
    child.wait(timeout=30)


def test_a_free_lock_is_taken_at_once_with_this_pid_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "board.lock"
    path.write_text("a much longer line a previous holder left behind\n")
    fd = take(path, deadline=0.0)  # a deadline already past: still one try
    try:
        assert path.read_text().strip() == str(os.getpid())
    finally:
        os.close(fd)


@pytest.mark.timeout(30)
def test_a_held_lock_is_given_up_at_the_deadline_naming_the_holder(
    tmp_path: Path, held: subprocess.Popen[str]
) -> None:
    path = tmp_path / "board.lock"
    start = time.monotonic()
    with pytest.raises(LockBusy) as err:
        take(path, deadline=start + 1.0)
    took = time.monotonic() - start
    assert 1.0 <= took < 10.0  # did not hang (a blocking lockf would wait for the child)
    assert err.value.holder.startswith(f"pid {held.pid} (")
    assert f"({sys.executable} -c " in err.value.holder  # its command line, from /proc
    assert 0.9 <= err.value.waited <= 1.0  # the wait it was given, never the overshoot past it
    assert str(err.value).startswith(f"board.lock held by pid {held.pid} ")


@pytest.mark.timeout(30)
def test_the_lock_is_taken_once_the_holder_lets_go_before_the_deadline(tmp_path: Path) -> None:
    path = tmp_path / "board.lock"
    child = _hold(path)
    assert child.stdin is not None
    start = time.monotonic()
    child.stdin.close()  # it exits: its lock goes with it
    fd = take(path, deadline=start + 20.0)
    os.close(fd)
    child.wait(timeout=30)
    assert time.monotonic() - start < 10.0


def test_a_fake_clock_polls_until_the_deadline_and_not_past_it(tmp_path: Path) -> None:
    path = tmp_path / "board.lock"
    child = _hold(path)
    now = [100.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    try:
        with pytest.raises(LockBusy) as err:
            take(path, deadline=100.12, clock=lambda: now[0], sleep=sleep, poll=0.05)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    assert sleeps == pytest.approx([0.05, 0.05, 0.02])  # the last sleep ends at the deadline
    assert err.value.waited == pytest.approx(0.12)


def test_a_holder_that_wrote_no_pid_is_an_unknown_process(tmp_path: Path) -> None:
    path = tmp_path / "board.lock"
    child = _hold(path, how="lockf")  # a governor of before issue 43: no pid in the file
    try:
        with pytest.raises(LockBusy, match="held by an unknown process"):
            take(path, deadline=0.0)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def test_the_holder_is_read_from_its_pid_and_proc(tmp_path: Path) -> None:
    path = tmp_path / "board.lock"
    proc = tmp_path / "proc"
    (proc / "1234").mkdir(parents=True)
    (proc / "1234" / "cmdline").write_bytes(b"governor\0launch\0--policy\0" + b"x" * 200 + b"\0")
    path.write_text("1234      \n")
    who = holder(path, proc)
    assert who.startswith("pid 1234 (governor launch --policy xxx") and who.endswith("...)")
    assert len(who) < 100  # the command line is cut
    path.write_text("999999999\n")
    assert holder(path, proc) == "pid 999999999 (gone)"
    path.write_text("\n")
    assert holder(path, proc) == "an unknown process"
    path.write_bytes(b"7" * 4096)  # not what a governor writes: not read past its cap
    assert holder(path, proc) == "an unknown process"


def test_a_symlinked_lock_file_is_refused_and_its_target_never_made(tmp_path: Path) -> None:
    path = tmp_path / "board.lock"
    target = tmp_path / "elsewhere"
    path.symlink_to(target)  # dangling: O_CREAT through it would create the target
    with pytest.raises(CappedReadError, match="a symlink"):
        take(path, deadline=0.0)
    assert not target.exists()
    target.write_text("")
    with pytest.raises(CappedReadError, match="a symlink"):
        take(path, deadline=0.0)


@pytest.mark.timeout(20)
def test_a_fifo_lock_file_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "board.lock"
    os.mkfifo(path)
    with pytest.raises(CappedReadError, match="a FIFO, not a file"):
        take(path, deadline=0.0)
