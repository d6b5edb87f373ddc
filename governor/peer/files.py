"""The one bounded read of a file another process writes (issue 43 item 3).

A state, an install manifest, the board file or a router preset may be anything an operator
or a misbehaving peer left at that path: a FIFO (an ``open`` for reading blocks until a writer
comes), ``/dev/zero`` (a read to EOF never ends and takes the process's memory), a symlink to
either, or a file of gigabytes. :func:`read_capped` opens it with ``O_NONBLOCK`` (a FIFO opens
at once; a regular file ignores the flag, open(2)) and, where asked, ``O_NOFOLLOW``;
``fstat``s the open file (no race with a rename between a ``stat`` and the ``open``) and
refuses anything but a regular file; then reads at most ``cap + 1`` bytes, so a file over its
cap is refused without reading the rest of it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["CappedReadError", "kind", "read_capped", "read_capped_text", "read_tail"]


class CappedReadError(OSError):
    """A file that is not a regular file, is a symlink where none is followed, or is larger
    than its cap; an OSError, so every reader that skips an unreadable file skips it too.
    ``path`` and ``problem`` (its ``strerror``) say which, in one line."""

    def __init__(self, path: Path | str, problem: str, err: int = errno.EINVAL) -> None:
        super().__init__(err, problem, str(path))
        self.path = Path(path)
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def kind(mode: int) -> str:
    """What a file of ``mode`` is, for a message ("a FIFO", "a device", ...)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def _open_regular(path: Path | str, follow: bool) -> tuple[int, os.stat_result]:
    """The fd and fstat of the regular file at ``path``, opened without blocking."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise CappedReadError(path, "a symlink (not followed)", errno.ELOOP) from None
        if err.errno == errno.EISDIR:
            raise CappedReadError(path, "a directory", errno.EISDIR) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CappedReadError(path, f"{kind(st.st_mode)}, not a file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_upto(fd: int, n: int, at: int = 0) -> bytes:
    """At most ``n`` bytes of ``fd`` from offset ``at``, fewer at its end."""
    chunks: list[bytes] = []
    while n > 0:
        chunk = os.pread(fd, min(n, 1 << 16), at)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
        at += len(chunk)
    return b"".join(chunks)


def read_tail(path: Path | str, cap: int, *, follow: bool = True) -> tuple[bytes, int]:
    """The last whole lines of the regular file at ``path`` within its last ``cap`` bytes, and
    how many bytes before them were left unread (0: the whole file): an append-only log whose
    newest entries matter most (the change journal) is read bounded without losing them.
    Raises as :func:`read_capped` does, but never for its size."""
    fd, st = _open_regular(path, follow)
    try:
        start = max(0, st.st_size - cap)
        data = _read_upto(fd, cap, start)
    finally:
        os.close(fd)
    if start == 0:
        return data, 0
    cut = data.find(b"\n") + 1  # the first line began before the window: not a whole one
    return data[cut:], start + cut


def read_capped(path: Path | str, cap: int, *, follow: bool = True) -> bytes:
    """At most ``cap`` bytes of the regular file at ``path``.

    Raises FileNotFoundError as ``open`` does (a caller tells "absent" from "wrong"), and
    :class:`CappedReadError` (an OSError) for a FIFO, a device, a socket, a directory, a
    symlink when ``follow`` is False, or a file over ``cap``; other OSErrors pass."""
    fd, st = _open_regular(path, follow)
    try:
        if st.st_size > cap:
            raise CappedReadError(path, f"{st.st_size} bytes, over its cap of {cap}", errno.EFBIG)
        data = _read_upto(fd, cap + 1)  # a byte past the cap: a file that grew after the fstat
        if len(data) > cap:
            raise CappedReadError(path, f"over its cap of {cap} bytes", errno.EFBIG)
        return data
    finally:
        os.close(fd)


def read_capped_text(path: Path | str, cap: int, *, follow: bool = True) -> str:
    """:func:`read_capped` decoded as UTF-8; a file that is not UTF-8 is a
    :class:`CappedReadError` ("not UTF-8 at byte N"), never a UnicodeDecodeError."""
    raw = read_capped(path, cap, follow=follow)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CappedReadError(path, f"not UTF-8 (at byte {err.start})") from None
