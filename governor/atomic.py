"""The one atomic file write: a reader (another process, a crash, a power cut with
``durable``) sees the old file or the new one, never half of one.

A temp file beside the target (same filesystem, so the rename is atomic: rename(2)), created
O_EXCL with 0600 and a name no other writer picks, gets the data, then its mode, then takes
the target's name. It never survives an error. Standard library ``os`` only: the run time
publishes its state through it, and ``tempfile`` would bring ``random``, ``hashlib`` and
``shutil`` into the supervisor.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(
    path: str | Path,
    data: str | bytes,
    mode: int = 0o644,
    *,
    durable: bool = False,
    exclusive: bool = False,
) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all, with ``mode`` (not
    masked by the umask). ``durable``: fsync the file before the rename and the directory
    after it. ``exclusive``: FileExistsError when ``path`` exists (link(2) decides: no race
    between a check and the write). OSError passes; the temp file is gone either way."""
    target = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(target))
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = _create(directory, name)
    try:
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, target)
        else:
            os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # after link(2), or on an error; after a rename there is none
    if durable:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _create(directory: str, name: str) -> tuple[int, str]:
    """A new temp file ``.NAME.PID.RANDOM.tmp`` in ``directory``, open for writing."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp name for {name} in {directory}")
