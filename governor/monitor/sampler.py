"""Sampler: memory.current, memory.peak and anon/file/refaults from memory.stat, at a fixed interval,
with its own CPU cost measured (process CPU time spent inside :meth:`Sampler.sample`).

Used for reports and live views, for the leak detector, and (where no PSI trigger could be
armed) to poll ``total=``. The default interval is 1 s; 50 ms is the floor (the seed's psutil
scaffold polled at 50 ms; measured cost: perf/pressure.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.parse import parse_max
from governor.log import get_logger
from governor.record import record

log = get_logger(__name__)

DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.05
_READ_MAX = 65536  # memory.stat is a few KiB


@record(frozen=True)
class Sample:
    t: float
    current: int | None
    peak: int | None
    anon: int | None
    file: int | None
    refault_file: int | None = None  # memory.stat workingset_refault_file (pages, cumulative)
    # the peak since this run started (memory.peak reset, 6.12); None: the kernel has no reset
    run_peak: int | None = None


class Sampler:
    def __init__(
        self,
        fs: CgroupFs,
        cgroup: str,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        if interval_s < MIN_INTERVAL_S:
            raise ValueError(f"sample interval {interval_s}s is below {MIN_INTERVAL_S}s")
        self.fs = fs
        self.cgroup = cgroup
        self.interval_s = interval_s
        self.cpu_clock = cpu_clock
        self.count = 0
        self.cpu_s = 0.0
        self.max_current = 0
        self.last: Sample | None = None
        self._missing: set[str] = set()
        self._fds: dict[str, int] = {}
        self._run_peak_fd: int | None = None
        self._run_peak_tried = False

    def _read(self, file: str) -> str | None:
        """The file's text through an fd held open (pread at 0 re-reads a kernfs seq_file;
        cheaper than an open/close per sample); None once it proved missing."""
        if file in self._missing:
            return None
        fd = self._fds.get(file)
        try:
            if fd is None:
                fd = self._fds[file] = self.fs.open_watch(self.cgroup, file)
            return os.pread(fd, _READ_MAX, 0).decode()
        except (GovernorError, OSError) as err:
            # no memory controller (hybrid hosts) or memory.peak before 5.19: say so once
            self._missing.add(file)
            log.info("sampler.missing", cgroup=self.cgroup, file=file, reason=str(err))
            return None

    def reset_peak(self) -> bool:
        """Start a per-run peak: a write to memory.peak (6.12) resets the peak seen through
        that fd, and the sampler reads ``run_peak`` through it from now on (a restart calls
        this). False where the kernel refuses (before 6.12 the file is read-only: the report's
        peak is then the group's since it was made, every run in it included)."""
        self._run_peak_tried = True
        try:
            fd = self.fs.open_reset(self.cgroup, kf.MEMORY_PEAK, kf.PEAK_RESET)
        except GovernorError as err:
            log.info("sampler.peak_reset", cgroup=self.cgroup, ok=False, reason=str(err))
            return False
        if self._run_peak_fd is not None:
            os.close(self._run_peak_fd)
        self._run_peak_fd = fd
        return True

    def _run_peak(self) -> int | None:
        if not self._run_peak_tried:
            self.reset_peak()
        if self._run_peak_fd is None:
            return None
        try:
            return parse_max(os.pread(self._run_peak_fd, _READ_MAX, 0).decode())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._run_peak_fd is not None:
            os.close(self._run_peak_fd)
            self._run_peak_fd = None

    def sample(self, now: float) -> Sample:
        c0 = self.cpu_clock()
        cur = self._read(kf.MEMORY_CURRENT)
        peak = self._read(kf.MEMORY_PEAK)
        stat = self._read(kf.MEMORY_STAT)
        anon = file = refault = None
        if stat is not None:
            for line in stat.splitlines():
                key, _, value = line.partition(" ")
                if key == "anon":
                    anon = int(value)
                elif key == "file":
                    file = int(value)
                elif key in ("workingset_refault_file", "workingset_refault"):
                    refault = int(value)  # "_file" since 5.9; listed after anon and file
                    break
        s = Sample(
            t=now,
            current=parse_max(cur) if cur else None,
            peak=parse_max(peak) if peak else None,
            anon=anon,
            file=file,
            refault_file=refault,
            run_peak=self._run_peak() if peak else None,
        )
        self.count += 1
        if s.current is not None:
            self.max_current = max(self.max_current, s.current)
        self.last = s
        self.cpu_s += self.cpu_clock() - c0
        return s

    def summary(self) -> dict[str, object]:
        last = self.last
        return {
            "interval_s": self.interval_s,
            "samples": self.count,
            "cpu_s": round(self.cpu_s, 6),
            "cpu_us_per_sample": round(self.cpu_s / self.count * 1e6, 1) if self.count else None,
            "max_current": self.max_current or None,
            "peak": last.peak if last else None,
            "run_peak": last.run_peak if last else None,
            "anon": last.anon if last else None,
            "file": last.file if last else None,
        }
