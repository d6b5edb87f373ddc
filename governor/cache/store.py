"""Where governor caches what it computed (compiled plans, GGUF headers), and the checks that
make a cache safe to read as root.

A compiled plan says which files root writes and which commands an ``exec`` action runs, so
a plan cache that another user could write would be a way to root. Entries are trusted only
when the directory is owned by the effective user (or root) and not writable by group or
others, and the entry itself is a regular file with the same owner and mode rules (opened with
O_NOFOLLOW). Anything else is ignored (and never written to): the caller recompiles.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from governor.atomic import write_atomic

_UNSAFE_MODE = stat.S_IWGRP | stat.S_IWOTH


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """GOVERNOR_CACHE_DIR, else /var/cache/governor as root, else $XDG_CACHE_HOME/governor."""
    env = os.environ if environ is None else environ
    if env.get("GOVERNOR_CACHE_DIR"):
        return Path(env["GOVERNOR_CACHE_DIR"])
    if os.geteuid() == 0:
        return Path("/var/cache/governor")
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "governor"


def _trusted(st: os.stat_result) -> bool:
    owner_ok = st.st_uid in (os.geteuid(), 0)
    return owner_ok and not (st.st_mode & _UNSAFE_MODE)


def trusted_dir(directory: Path) -> bool:
    """The directory exists, is a real directory and is safe to read entries from."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and _trusted(st)


def read_entry(directory: Path, name: str) -> bytes | None:
    """The entry's bytes when it and its directory pass the checks; None otherwise. The
    directory is opened once (O_NOFOLLOW) and checked through its fd, and the entry opened
    relative to that fd: a rename or symlink swap of the path after the check changes nothing."""
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not _trusted(os.fstat(dfd)):
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted(st):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_entry(directory: Path, name: str, data: bytes) -> bool:
    """Write atomically (temp file + rename) with mode 0600 in a 0700 directory it creates;
    False (nothing written) when the directory exists but is not trusted, or on any error."""
    with contextlib.suppress(OSError):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not trusted_dir(directory):
        return False
    try:
        write_atomic(directory / name, data, 0o600)
    except OSError:
        return False
    return True
