"""A lock another process may hold, taken against the caller's deadline (issue 43 item 2).

The holder may be an install across a ``daemon-reload``, a launch stopped with ^Z or one whose
``memory.max`` write is blocked in reclaim: a blocking ``lockf`` would wait for it silently and
without end. :func:`take` polls ``LOCK_NB`` until the caller's monotonic deadline and then
raises :class:`LockBusy`, which names the holder: whoever holds the lock writes its pid into
the file (read back with :func:`governor.peer.files.read_capped`), and its command line comes
from ``/proc/PID/cmdline``, cut.

The file is opened with ``O_NOFOLLOW`` (a symlink planted at its path is not followed to
whatever it names) and ``O_NONBLOCK`` (a FIFO opens at once), and refused unless ``fstat``
says it is a regular file (:class:`~governor.peer.files.CappedReadError`, an OSError).

A POSIX record lock (``lockf``), not ``flock``: a process forked while it is held (a watchdog,
a prefetch helper) does not inherit it, so it goes with this process's close. The flip side
(fcntl(2)): closing *any* descriptor of the file releases this process's lock, so a holder
never reads its own lock file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from governor.errors import one_line
from governor.peer.files import CappedReadError, kind, read_capped

__all__ = ["POLL_S", "LockBusy", "holder", "take"]

POLL_S = 0.05  # how often a held lock is tried again: a 50 ms late start at worst
PID_BYTES = 64  # read of the holder's pid line (a longer file is not one a governor wrote)
PID_WIDTH = 10  # the pid written: pid_max is at most 2^22 (proc(5)), padded so no write shrinks
CMDLINE_BYTES = 4096  # of /proc/PID/cmdline: enough for the words shown
CMDLINE_SHOWN = 80  # characters of the holder's command line in a message


class LockBusy(Exception):
    """The lock at ``path`` was still held at the deadline, after ``waited`` seconds (the wait
    it was given: from the first try to the deadline);
    ``holder``: who holds it, as a message names it ("pid 1234 (governor launch ...)")."""

    def __init__(self, path: Path, holder: str, waited: float) -> None:
        super().__init__(f"{path.name} held by {holder}")
        self.path = path
        self.holder = holder
        self.waited = waited


def holder(path: Path, proc: Path = Path("/proc")) -> str:
    """Who holds the lock at ``path`` as its file says: "pid N (its command line, cut)",
    "pid N (gone)" when it exited since, or "an unknown process" (no pid written yet, or not
    readable)."""
    try:
        line = read_capped(path, PID_BYTES, follow=False).split(b"\n", 1)[0].strip()
        pid = int(line) if line.isdigit() else 0
    except OSError:
        pid = 0
    if pid <= 0:
        return "an unknown process"
    try:  # a kernel file, not a peer's: its size is the process's own command line
        fd = os.open(proc / str(pid) / "cmdline", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, CMDLINE_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return f"pid {pid} (gone)"
    words = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return f"pid {pid} ({one_line(words, CMDLINE_SHOWN) or 'no command line'})"


def _open(path: Path, mode: int) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(path, flags, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise CappedReadError(path, "a symlink (not followed)", errno.ELOOP) from None
        if err.errno == errno.EISDIR:
            raise CappedReadError(path, "a directory", errno.EISDIR) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CappedReadError(path, f"{kind(st.st_mode)}, not a file")
    return fd


def take(
    path: Path,
    *,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = POLL_S,
    mode: int = 0o644,
    proc: Path = Path("/proc"),
) -> int:
    """The fd of the lock at ``path`` (lockf LOCK_EX), held, with this process's pid written in
    the file; close it to release. Tried at once and every ``poll`` seconds until ``deadline``
    (on ``clock``: a deadline already past still gets one try); :class:`LockBusy` then.
    CappedReadError (an OSError) when the path is not a regular file; other OSErrors pass."""
    fd = _open(path, mode)
    try:
        start = clock()
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            now = clock()
            if now >= deadline:
                # the wait it was given, not the clock's overshoot past it (a loaded machine
                # said "held ... for 2.01s" of a 2 s wait)
                raise LockBusy(path, holder(path, proc), max(0.0, deadline - start))
            sleep(min(poll, deadline - now))
        # fixed width, then cut: a waiter reading meanwhile sees a whole pid or the old one
        line = f"{os.getpid():<{PID_WIDTH}d}\n".encode()
        os.pwrite(fd, line, 0)
        os.ftruncate(fd, len(line))
        return fd
    except BaseException:
        os.close(fd)
        raise
