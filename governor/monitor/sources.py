"""Event sources: kernfs files that notify on change, and the board-wide readings.

memory.events and cgroup.events generate a file-modified event when they change
(cgroup-v2.rst): an fd polled for POLLPRI wakes up, and re-reading the file (pread at 0) re-arms
it (fs/kernfs/file.c: kernfs_generic_poll compares the open file's event count, updated on
read). No interval loop is needed for them. In a test tree they are regular files, which epoll
refuses (EPERM); the monitor then re-reads them at every sample instead and says so once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from governor.board.budget import reserve_for
from governor.board.file import read_board
from governor.errors import BackendError, GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.devmem import DeviceMemoryReader, as_rows, total
from governor.kernel.parse import parse_flat_keyed
from governor.kernel.procfs import ProcFs
from governor.log import get_logger
from governor.monitor import triggers
from governor.monitor.rules import Rule
from governor.monitor.thrash import Thrash, board_file_bytes, refault_pages
from governor.record import record

if TYPE_CHECKING:
    from governor.monitor.leak import LeakDetector
    from governor.monitor.sampler import Sample

log = get_logger(__name__)

_READ_MAX = 65536


class EventFile:
    """A flat-keyed kernfs file held open; :meth:`changes` returns counter increases."""

    def __init__(self, fs: CgroupFs, cgroup: str, file: str) -> None:
        self.cgroup = cgroup
        self.file = file
        self.fd = fs.open_watch(cgroup, file)
        self.pollable = True  # set False by the monitor when epoll refuses the fd
        self.values = self.read()

    def read(self) -> dict[str, int]:
        try:
            text = os.pread(self.fd, _READ_MAX, 0).decode()
            return parse_flat_keyed(text)
        except (OSError, ValueError) as err:
            raise BackendError(
                f"cannot read cgroup file: {err}", cgroup=self.cgroup, file=self.file
            ) from err

    def changes(self) -> tuple[dict[str, int], dict[str, int]]:
        """(increases since the last read, the new values)."""
        new = self.read()
        inc = {k: v - self.values.get(k, 0) for k, v in new.items() if v > self.values.get(k, 0)}
        self.values = new
        return inc, new

    def close(self) -> None:
        os.close(self.fd)


def open_optional(fs: CgroupFs, cgroup: str, file: str) -> EventFile | None:
    """The event file, or None (logged once) when it is missing (no memory controller)."""
    try:
        return EventFile(fs, cgroup, file)
    except GovernorError as err:
        log.info("monitor.source_missing", cgroup=cgroup, file=file, reason=str(err))
        return None


def protected_cache(fs: CgroupFs, group: str) -> int:
    """The group's page cache that its memory.min protects: min(memory.min, memory.stat file).
    MemAvailable counts it as reclaimable, but reclaim does not take it (the engine's model):
    what the board can really give is MemAvailable less this. 0 when unreadable."""
    floor = fs.read_limit(group, kf.MEMORY_MIN, unreadable=0)
    try:
        file = fs.memory_stat(group)["file"]
    except (GovernorError, KeyError, ValueError):
        return 0
    return file if floor is None else min(floor, file)


class Board:
    """Board-wide readings under /proc: MemAvailable and system memory PSI (injected root)."""

    def __init__(self, proc: ProcFs) -> None:
        self.proc = proc
        self._reserve: int | None = None

    def memavailable(self) -> int | None:
        try:
            return self.proc.meminfo().get("MemAvailable")
        except (OSError, ValueError):
            return None

    def available(self, fs: CgroupFs, group: str) -> int | None:
        """``board available``: MemAvailable less the group's protected page cache."""
        raw = self.memavailable()
        return None if raw is None else max(0, raw - protected_cache(fs, group))

    def refaults(self) -> tuple[int, int] | None:
        """``board refaults``: (/proc/vmstat workingset_refault_file in pages, the file LRUs
        of /proc/meminfo in bytes); None when either is unreadable."""
        try:
            pages = refault_pages(self.proc.vmstat())
            file = board_file_bytes(self.proc.meminfo())
        except (OSError, ValueError):
            return None
        return None if pages is None or file is None else (pages, file)

    def levels(self, fs: CgroupFs, group: str, sources: Collection[str]) -> dict[str, int | None]:
        """The board-wide levels among these sources (monitor/triggers.py) that the rules
        compare (rules.Observations)."""
        out: dict[str, int | None] = {}
        if "memavailable" in sources:
            out["memavailable"] = self.memavailable()
        if "available" in sources:
            out["available"] = self.available(fs, group)
        if "spare" in sources:
            out["spare"] = self.spare(fs, group)
        if "board_file" in sources:
            out["board_file"] = self.file_cache()
        return out

    def file_cache(self) -> int | None:
        """``board file``: the file LRUs of /proc/meminfo in bytes (the cache reclaim takes)."""
        try:
            return board_file_bytes(self.proc.meminfo())
        except (OSError, ValueError):
            return None

    def spare(self, fs: CgroupFs, group: str) -> int | None:
        """``board available`` less the board's reserve (the OS's and ungoverned services'
        memory, docs/several.md): what a governed slice may still grow into before the
        board's other tenants are squeezed. Negative when the reserve is eaten into."""
        avail = self.available(fs, group)
        reserve = self.reserve()
        return None if avail is None or reserve is None else avail - reserve

    def reserve(self) -> int | None:
        """The board's reserve: the board file's ``[board] reserve``, else the default (128
        MiB + MemTotal/16, at most 1 GiB: governor/board/budget.py); read once."""
        if self._reserve is None:
            try:
                memtotal = self.proc.meminfo()["MemTotal"]
            except (OSError, ValueError, KeyError):
                return None
            reserve = read_board().reserve  # an invalid file: the default
            if reserve is not None and reserve >= memtotal:
                # a reserve that leaves no budget (check and admission refuse it: a --force
                # launch runs beside it): every sample would be "short", so the default holds
                log.warning("board.reserve_ignored", reserve=reserve, memtotal=memtotal)
                reserve = None
            self._reserve = reserve_for(memtotal) if reserve is None else reserve
        return self._reserve


@record
class DeviceMemory:
    """The group's device memory at each sample (governor/kernel/devmem.py), read only when
    ``on``: a rule needs it (``device memory > SIZE``) or the plan has [device]: fdinfo of every
    fd of every process costs more than the cgroup files. Keeps the peak per (driver, region)
    and of the total, for the launch report."""

    fs: CgroupFs
    proc: ProcFs
    on: bool

    def __post_init__(self) -> None:
        self.reader = DeviceMemoryReader(self.fs, self.proc)
        self.peak: dict[tuple[str, str], int] = {}
        self.peak_total = 0

    def sample(self, group: str) -> int | None:
        if not self.on:
            return None
        summary = self.reader.group(group)
        for key, n in summary.items():
            self.peak[key] = max(self.peak.get(key, 0), n)
        now = total(summary)
        self.peak_total = max(self.peak_total, now)
        return now

    def report(self) -> dict[str, object]:
        if not self.on:
            return {}
        return {
            "device_memory_peak": as_rows(self.peak),
            "device_memory_peak_bytes": self.peak_total,
        }


class Levels:
    """What the plan's rules compare, read at each sample: each rule's kind names its sources
    (monitor/triggers.py) and only those are read (the board's files, the group's fdinfo, a
    plug-in's sampler); the anon slope's detectors and the refault meters are kept per rule.
    ``sample`` returns the values by rules.Observations' field names."""

    def __init__(
        self,
        fs: CgroupFs,
        group: str,
        board: Board,
        rules: Sequence[Rule],
        *,
        device: bool,  # the plan has [device]: sampled for the report whatever the rules
        page_size: int,
    ) -> None:
        self.fs = fs
        self.group = group
        self.board = board
        self.sources = triggers.sources(r.kind for r in rules)
        self.devmem = DeviceMemory(fs, board.proc, device or "device" in self.sources)
        wants = {r.index: triggers.row(r.kind).sources for r in rules}
        # the slope's detector is loaded only for a plan with a rule that samples it
        self.leaks: dict[int, LeakDetector] = {
            r.index: triggers.meter("leak")(r.window_s) for r in rules if "leak" in wants[r.index]
        }
        thrash = [  # the group's or the board's refault counters
            (r.index, source, r.window_s)
            for r in rules
            for source in wants[r.index]
            if source in ("refaults", "board_refaults")
        ]
        self.thrash = Thrash(thrash, page_size, board.refaults)
        # a plug-in trigger's own sources (monitor/triggers.py SAMPLERS)
        self.samplers: dict[str, Callable[[CgroupFs, str, ProcFs], int | float | None]] = {
            name: triggers.load(path)
            for name, path in triggers.SAMPLERS.items()
            if name in self.sources
        }

    def sample(self, now: float, s: Sample) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.board.levels(self.fs, self.group, self.sources))
        out["device"] = self.devmem.sample(self.group)
        if s.anon is not None:
            leak: dict[int, float] = {}
            for index, det in self.leaks.items():
                det.add(now, s.anon)
                slope = det.slope()
                if slope is not None:
                    leak[index] = slope
            out["leak"] = leak
        out["refaults"] = self.thrash.sample(now, s.refault_file, s.file)
        if self.samplers:
            proc = self.board.proc
            out["extra"] = {n: read(self.fs, self.group, proc) for n, read in self.samplers.items()}
        return out
