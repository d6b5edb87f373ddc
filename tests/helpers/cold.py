"""A cold start for one engine's files without a cold guest (issue 47 item 3).

A file page is charged to the cgroup that first faults it in (cgroup-v2.rst "Memory
Ownership"), so a test that compares an engine's memory.peak with its estimate needs the
model and the engine's binary out of the page cache before the launch. `drop_caches` does
that by dropping EVERY clean page of the guest: the test runner's and the governor's Python
imports too, which the next `governor` then re-reads over the guest's 9p root (cache=loose)
under TCG. posix_fadvise(POSIX_FADV_DONTNEED) drops the named files' unmapped clean pages
only (mm/fadvise.c: invalidate_mapping_pages); `resident` says what is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from pathlib import Path


def drop_file_pages(*paths: Path) -> None:
    """Evict each file's unmapped pages from the page cache (symlinks followed)."""
    for path in paths:
        fd = os.open(path.resolve(), os.O_RDONLY)
        try:
            # dirty pages are not dropped: a freshly written file is written back first (a
            # file system that cannot sync is left to `cold`'s residency check)
            with contextlib.suppress(OSError):
                os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(path: Path) -> float:
    """Fraction of `path`'s pages in the page cache (mincore on a fresh mapping: no faults)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = path.stat().st_size
    fd = os.open(path.resolve(), os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
        rc = libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
        assert rc == 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw) / len(vec.raw)


def cold(*paths: Path) -> None:
    """drop_file_pages, then fail if a file kept more than 5 % of its pages (mapped by a live
    process, or a filesystem that ignores the advice): the test's premise would not hold."""
    drop_file_pages(*paths)
    for path in paths:
        left = resident(path)
        assert left < 0.05, f"{path}: {left:.0%} still cached after POSIX_FADV_DONTNEED"
