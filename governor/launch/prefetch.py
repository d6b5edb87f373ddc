"""Warm the model into memory charged to the slice and verify it with mincore().

Runs in the prefetch helper (governor/launch/helper.py), a process born in the engine's leaf
cgroup while the engine starts: page cache is charged to the cgroup of the process that first
touches a page and moving a process later does not move its charges (cgroup-v2.rst, "Memory
Ownership"), so the governor's own cgroup is never charged for the model.

Modes (``[prefetch] mode``):

- ``advise``: POSIX_FADV_WILLNEED per 128 KiB chunk plus MADV_WILLNEED on the mapping. A hint:
  the kernel starts read-ahead and returns; nothing waits for it. One whole-file fadvise brings
  only max(io_pages, ra_pages) in (force_page_cache_ra() in mm/readahead.c caps each call; ~8 MiB
  of a 1 GiB file here, notes/kernel.md), hence the small chunks.
- ``populate``: the first method that works, probed in this order and reported as
  ``prefetch_method``: MADV_POPULATE_READ (Linux >= 5.14; faults the pages in and reports I/O
  errors), MAP_POPULATE (a populated mapping per chunk; errors are silent), a read loop (any file
  system). Then mincore() per page and a top-up of what is missing (read loops sometimes ended
  at 99.5% resident, notes/kernel.md).
- ``lock``: populate, then the helper mlock()s every file and holds the lock for the engine's
  lifetime (governor/launch/helper.py says why a separate process and not RLIMIT_MEMLOCK).

Measured (perf/prefetch.py, 1 GiB, cold cache, host virtual disk, noisy: a TCG guest shared
the 2 cores): MADV_POPULATE_READ 2.05-2.25 GB/s, MAP_POPULATE 2.16-2.36, read loop 0.62-1.15,
chunked fadvise until resident 1.27-1.48, cat 1.97-2.13, vmtouch -t 1.14-1.64, dd iflag=direct
0.61-1.36.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import mmap
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

from governor.log import get_logger
from governor.record import record
from governor.sizes import human_bytes

if TYPE_CHECKING:
    from governor.launch.launcher import LaunchReport

log = get_logger(__name__)

Mode = Literal["none", "advise", "populate", "lock"]
# "resident": every page was in the page cache already (a warm start): nothing was filled
Method = Literal["madv_populate_read", "map_populate", "read", "fadvise_willneed", "resident"]

MADV_WILLNEED = 3  # <asm-generic/mman-common.h>
MADV_POPULATE_READ = 22  # <asm-generic/mman-common.h>; Python 3.11's mmap has no constant
MADV_POPULATE_READ_MIN = (5, 14)  # first kernel with MADV_POPULATE_READ (EINVAL before)
PIDFD_MIN = (5, 3)  # pidfd_open(2): the locker's wait for the engine
PROT_READ = 0x1
MAP_SHARED = 0x01
MAP_FAILED = ctypes.c_void_p(-1).value

CHUNK = 64 << 20  # populate/verify granularity: progress steps, and bounded address space
ADVISE_CHUNK = 128 << 10  # <= the default read-ahead window (VM_READAHEAD_PAGES): never capped
READ_BUF = 1 << 20
TOPUP_ROUNDS = 3
PROGRESS_MIN_BYTES = 256 << 20  # smaller files: only prefetch.done
PROGRESS_EVERY_S = 1.0

# ------------------------------------------------------------------------------------ pure parts


def kernel_version(release: str) -> tuple[int, int]:
    """ "6.1.0-57-amd64" -> (6, 1); unknown -> (0, 0)."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m[1]), int(m[2])) if m else (0, 0)


def populate_candidates(version: tuple[int, int]) -> tuple[Method, ...]:
    """Methods to probe for ``populate``/``lock``, best first."""
    best: tuple[Method, ...] = ("map_populate", "read")
    if version >= MADV_POPULATE_READ_MIN:
        return ("madv_populate_read", *best)
    return best


_LOW_BIT = bytes(b & 1 for b in range(256))


def resident_pages(vec: bytes) -> int:
    """Pages resident in a mincore() vector (bit 0 of each byte; the others are reserved)."""
    return vec.translate(_LOW_BIT).count(1)


def resident_fraction(vec: bytes) -> float:
    return 1.0 if not vec else resident_pages(vec) / len(vec)


def _all_resident(vec: bytes, off: int, length: int, page_size: int) -> bool:
    """Whether every page of [off, off + length) is resident in a whole-file mincore vector."""
    first = off // page_size
    last = (off + length + page_size - 1) // page_size
    return vec[first:last].translate(_LOW_BIT).count(0) == 0


def missing_ranges(vec: bytes, page_size: int, *, base: int = 0) -> list[tuple[int, int]]:
    """(offset, length) byte ranges of the pages a mincore() vector reports as not resident."""
    out: list[tuple[int, int]] = []
    start: int | None = None
    for i, b in enumerate(vec):
        if not b & 1:
            if start is None:
                start = i
        elif start is not None:
            out.append((base + start * page_size, (i - start) * page_size))
            start = None
    if start is not None:
        out.append((base + start * page_size, (len(vec) - start) * page_size))
    return out


def progress_line(done: int, total: int, seconds: float, *, width: int = 24) -> str:
    """One TTY line: bar, bytes, rate, percent."""
    frac = 1.0 if total <= 0 else min(1.0, done / total)
    filled = int(frac * width)
    rate = done / seconds if seconds > 0 else 0.0
    return (
        f"prefetch [{'#' * filled}{'.' * (width - filled)}] {human_bytes(done)}/"
        f"{human_bytes(total)} {human_bytes(int(rate))}/s {frac * 100:.1f}%"
    )


# ----------------------------------------------------------------------------------- libc calls


class _Libc:
    """mmap/munmap/madvise/mincore/mlock through ctypes: Python's mmap object hides the
    address that mincore() and mlock() need."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter runs on
        self.mmap = lib.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        self.munmap = lib.munmap
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.madvise = lib.madvise
        self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.mincore = lib.mincore
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        self.mlock = lib.mlock
        self.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def map(self, fd: int, offset: int, length: int, extra_flags: int = 0) -> int:
        addr = self.mmap(None, length, PROT_READ, MAP_SHARED | extra_flags, fd, offset)
        if addr is None or addr == MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap: {os.strerror(err)}")
        return int(addr)

    def unmap(self, addr: int, length: int) -> None:
        self._check(self.munmap(addr, length), "munmap")

    def advise(self, addr: int, length: int, advice: int) -> None:
        self._check(self.madvise(addr, length, advice), f"madvise({advice})")

    def core(self, addr: int, length: int, page_size: int) -> bytes:
        vec = ctypes.create_string_buffer((length + page_size - 1) // page_size)
        self._check(self.mincore(addr, length, vec), "mincore")
        return vec.raw

    def lock(self, addr: int, length: int) -> None:
        self._check(self.mlock(addr, length), "mlock")


# ------------------------------------------------------------------------------------- progress


class Progress:
    """A bar on a TTY for big files, else ``prefetch.progress`` events about once a second."""

    def __init__(
        self,
        total: int,
        *,
        tty: TextIO | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.tty = tty
        self.clock = clock
        self.started = clock()
        self.last = self.started
        self.done = 0
        self.enabled = total >= PROGRESS_MIN_BYTES

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        now = self.clock()
        if not self.enabled or now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        if self.tty is not None:
            self.tty.write("\r" + progress_line(self.done, self.total, now - self.started))
            self.tty.flush()
        else:
            log.info(
                "prefetch.progress",
                bytes=self.done,
                total=self.total,
                rate=int(self.done / max(now - self.started, 1e-9)),
            )

    def finish(self, resident: float) -> None:
        if self.enabled and self.tty is not None:
            line = progress_line(self.total, self.total, self.clock() - self.started)
            self.tty.write(f"\r{line} resident {resident * 100:.1f}%\n")
            self.tty.flush()


# ---------------------------------------------------------------------------------- the prefetch


@record
class PrefetchResult:
    files: list[str]
    mode: str
    method: str
    bytes: int
    seconds: float
    resident_fraction: float
    resident_bytes: int
    topup_rounds: int = 0
    locked_bytes: int | None = None
    locker_pid: int | None = None
    error: str | None = None

    def fill(self, report: LaunchReport) -> None:
        """The ``--report`` JSON keys (the launcher's LaunchReport)."""
        report.prefetch_bytes = self.bytes
        report.prefetch_seconds = self.seconds
        report.resident_fraction = self.resident_fraction
        report.prefetch_method = self.method
        report.extra["prefetch_mode"] = self.mode
        report.extra["prefetch_topup_rounds"] = self.topup_rounds
        if self.locked_bytes is not None:
            report.extra["prefetch_locked_bytes"] = self.locked_bytes
            report.extra["prefetch_locker_pid"] = self.locker_pid


def _chunks(size: int, chunk: int) -> Iterable[tuple[int, int]]:
    off = 0
    while off < size:
        yield off, min(chunk, size - off)
        off += chunk


class Prefetcher:
    """Runs one mode over a list of files (in the engine's child, after the cgroup join)."""

    def __init__(
        self,
        *,
        libc: _Libc | None = None,
        page_size: int = mmap.PAGESIZE,
        release: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.libc = libc or _Libc()
        self.page_size = page_size
        self.version = kernel_version(release if release is not None else os.uname().release)
        self.clock = clock
        self._working: Method | None = None

    # one range of one file with one method (offset page-aligned)
    def _fill(self, method: Method, fd: int, off: int, length: int) -> None:
        libc = self.libc
        if method == "read":
            buf = bytearray(READ_BUF)
            view = memoryview(buf)
            pos, end = off, off + length
            while pos < end:
                n = os.preadv(fd, [view[: min(READ_BUF, end - pos)]], pos)
                if n <= 0:
                    break
                pos += n
            return
        if method == "fadvise_willneed":
            for o, n in _chunks(length, ADVISE_CHUNK):
                os.posix_fadvise(fd, off + o, n, os.POSIX_FADV_WILLNEED)
            addr = libc.map(fd, off, length)
            try:
                libc.advise(addr, length, MADV_WILLNEED)
            finally:
                libc.unmap(addr, length)
            return
        flags = mmap.MAP_POPULATE if method == "map_populate" else 0
        addr = libc.map(fd, off, length, flags)
        try:
            if method == "madv_populate_read":
                libc.advise(addr, length, MADV_POPULATE_READ)
        finally:
            libc.unmap(addr, length)

    def _fill_probing(self, fd: int, off: int, length: int) -> Method:
        """The first method that works on this host (EINVAL: not in this kernel; ENODEV: the
        file system cannot mmap)."""
        if self._working is not None:
            self._fill(self._working, fd, off, length)
            return self._working
        last: OSError | None = None
        for method in populate_candidates(self.version):
            try:
                self._fill(method, fd, off, length)
            except OSError as err:
                if err.errno not in (errno_mod.EINVAL, errno_mod.ENODEV, errno_mod.ENOSYS):
                    raise
                log.debug("prefetch.method_unavailable", method=method, errno=err.errno)
                last = err
                continue
            self._working = method
            return method
        raise last or OSError(errno_mod.EINVAL, "no prefetch method works")

    def residency(self, fd: int, size: int) -> bytes:
        """mincore() vector of the whole file, mapped one chunk at a time."""
        parts = []
        for off, n in _chunks(size, CHUNK):
            addr = self.libc.map(fd, off, n)
            try:
                parts.append(self.libc.core(addr, n, self.page_size))
            finally:
                self.libc.unmap(addr, n)
        return b"".join(parts)

    def run(self, paths: Sequence[Path], mode: Mode, *, tty: TextIO | None) -> PrefetchResult:
        started = self.clock()
        sizes = [os.stat(p).st_size for p in paths]
        total = sum(sizes)
        progress = Progress(total, tty=tty, clock=self.clock)
        method: Method = "fadvise_willneed" if mode == "advise" else "resident"
        vectors: list[bytes] = []
        rounds = 0
        for path, size in zip(paths, sizes, strict=True):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                # populate/lock fill only what is not resident yet: on a warm start mincore()
                # of the 1.1 GiB model costs ~20 ms of CPU, MADV_POPULATE_READ of it ~130 ms
                # (page tables built and torn down), taken from the engine's 2 cores
                before = self.residency(fd, size) if size and mode != "advise" else None
                for off, n in _chunks(size, CHUNK):
                    if mode == "advise":
                        self._fill("fadvise_willneed", fd, off, n)
                    elif before is None or not _all_resident(before, off, n, self.page_size):
                        method = self._fill_probing(fd, off, n)
                    progress.add(n)
                vec = self.residency(fd, size) if size else b""
                if mode != "advise":
                    # top up what was evicted again or skipped (read loops end at ~99.5%)
                    for i in range(TOPUP_ROUNDS):
                        gaps = missing_ranges(vec, self.page_size)
                        if not gaps:
                            break
                        rounds = max(rounds, i + 1)
                        for off, n in gaps:
                            method = self._fill_probing(fd, off, min(n, size - off))
                        vec = self.residency(fd, size)
                vectors.append(vec)
            finally:
                os.close(fd)
        everything = b"".join(vectors)
        frac = resident_fraction(everything)
        progress.finish(frac)
        return PrefetchResult(
            files=[str(p) for p in paths],
            mode=mode,
            method=method,
            bytes=total,
            seconds=round(self.clock() - started, 3),
            resident_fraction=round(frac, 4),
            resident_bytes=min(total, resident_pages(everything) * self.page_size),
            topup_rounds=rounds,
        )
