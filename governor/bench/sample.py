"""The samples behind `governor bench`'s memory figures, and where each figure came from.

The policy's group is read (memory.current + memory.stat) every ``interval``; without the memory
controller in the group (no memory.peak, no memory.current: a cgroup2 that has none, or
`--allow-missing memory`) the seed's sampler takes over, the RSS of the engine's process tree
every 50 ms (psutil; anon = RSS - shared, file = shared). :func:`sources` names what each
row's peak and series came from, and why there is none when there is none.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.peer.files import read_capped
from governor.rundir.state import STATE_MAX

MIN_INTERVAL_S = 0.05
# where a row's figures come from: the kernel's high-water mark, else the highest sample
PEAK_KERNEL = "memory.peak"
SERIES_CGROUP = "memory.current"  # memory.current + memory.stat of the policy's group
SERIES_RSS = "rss"  # psutil: RSS of the engine's process tree (no memory controller)
RSS_INTERVAL_S = 0.05  # the seed's sampler: no kernel peak between samples, so its floor


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the run started
    current: int
    anon: int
    file: int


Reader = Callable[[], tuple[int, int, int] | None]


class MemorySeriesRecorder:
    """A thread reading memory.current and memory.stat of one cgroup every ``interval``, for the
    whole of one run. Not governor.monitor.sampler.Sampler: that one holds the files open and
    gives up on a missing file, while the launch this records creates the cgroup after it starts.

    ``fallback`` (the RSS of the engine's tree) is read, every RSS_INTERVAL_S, while the cgroup
    gives nothing; the first source that answers is kept for the whole run (one source per
    series): the group exists before the engine starts, so with a memory controller the
    cgroup always answers first."""

    def __init__(self, read: Reader, interval: float, fallback: Reader | None = None) -> None:
        self.read = read
        self.fallback = fallback
        self.interval = max(MIN_INTERVAL_S, interval)
        self.samples: list[Sample] = []
        self.source: str | None = None
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="bench-series", daemon=True)

    def start(self) -> MemorySeriesRecorder:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def _sample(self) -> tuple[int, int, int] | None:
        got = None
        if self.source in (None, SERIES_CGROUP):
            got = self.read()
            if got is not None:
                self.source = SERIES_CGROUP
        if got is None and self.source in (None, SERIES_RSS) and self.fallback is not None:
            got = self.fallback()
            if got is not None:
                self.source = SERIES_RSS
        return got

    def _loop(self) -> None:
        while not self._stop.is_set():
            got = self._sample()
            if got is not None:
                t = round(time.monotonic() - self._t0, 3)
                self.samples.append(Sample(t, *got))
            fast = self.fallback is not None and self.source != SERIES_CGROUP
            self._stop.wait(min(self.interval, RSS_INTERVAL_S) if fast else self.interval)

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.samples


class EngineTreeReader:
    """The seed's sampler: RSS of the engine's process tree (psutil). The engine is the pid
    the launch publishes in its state.json (``engine_pid``), taken only when it is a child of
    this run's launch (a state left by another run names someone else), and looked up again
    after a restart. One /proc/PID/statm per process (memory_info) and a walk for children."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.launch_pid: int | None = None  # set once the launch is started
        self._engine: Any = None  # psutil.Process

    def _find(self) -> Any:

        if self.launch_pid is None:
            return None
        try:
            pid = json.loads(read_capped(self.state, STATE_MAX, follow=False)).get("engine_pid")
        except (OSError, ValueError, AttributeError):
            return None
        if not isinstance(pid, int) or isinstance(pid, bool):
            return None
        try:
            proc = psutil.Process(pid)
            return proc if proc.ppid() == self.launch_pid else None
        except psutil.Error:
            return None

    def __call__(self) -> tuple[int, int, int] | None:

        if self._engine is None or not self._engine.is_running():
            self._engine = self._find()
        if self._engine is None:
            return None
        rss = shared = 0
        try:
            procs = [self._engine, *self._engine.children(recursive=True)]
        except psutil.Error:
            return None
        for proc in procs:
            try:
                m = proc.memory_info()
            except psutil.Error:
                continue  # exited between the walk and the read
            rss += m.rss
            shared += m.shared
        return rss, rss - shared, shared


def cgroup_reader(fs: Any, group: str) -> Callable[[], tuple[int, int, int] | None]:

    def read() -> tuple[int, int, int] | None:
        try:
            current = int(fs.read(group, kf.MEMORY_CURRENT))
            stat = fs.memory_stat(group)
        except (GovernorError, ValueError, OSError):
            return None  # not created yet, or already removed
        return current, stat.get("anon", 0), stat.get("file", 0)

    return read


def sources(
    kernel_peak: bool, series_source: str | None, sampled: bool, state: Path | None
) -> tuple[str | None, str | None]:
    """(where the peak came from, a note on what is missing and why)."""
    if kernel_peak:
        peak = PEAK_KERNEL
    elif sampled:
        peak = f"{series_source} samples"
    else:
        peak = None
    if series_source == SERIES_RSS and sampled:
        return peak, (
            "no memory controller in the policy's group (no memory.peak, no memory.current):"
            f" the engine's RSS every {RSS_INTERVAL_S * 1000:g} ms, a peak between two samples"
            " is missed and page cache is not counted"
        )
    if sampled:
        note = None if kernel_peak else "no memory.peak (kernel < 5.19): the highest sample"
        return peak, note
    if state is None:
        return peak, "no memory.current in the policy's group and no engine pid to sample"
    return peak, (
        "no memory.current in the policy's group, and the engine's pid was never published"
        f" ({state}) or it exited before the first sample"
    )
