"""Thrash (pure): file pages refaulted in a window as a share of the file cache.

A refault is a file page read again soon after it was evicted (mm/workingset.c: its shadow
entry says it would have stayed had the cache been larger). ``workingset_refault_file`` counts
them in pages (memory.stat per group, /proc/vmstat for the board; plain ``workingset_refault``
before 5.9). A model squeezed out of its page cache and re-read shows here long before, or
without ever, stalling a task in reclaim: the re-read is I/O wait and CPU time, which PSI's
memory line counts only for the part spent in reclaim or in the refault's I/O, and only as
``some`` while another task of the group still runs. Android's lmkd acts on the same share
(``ro.lmk.thrashing_limit``: refaults since the last kill as a share of the file LRU).

:class:`RefaultMeter` takes (time, refault counter in pages, file cache bytes) samples and
answers the share once the window is covered: ``(refaults now - refaults a window ago) *
page size / file bytes now * 100``.

Bounded (issue 43 item 4): the policy accepts ``refaults > 50%/8760h``, and a meter that kept
every 1 s sample of a year grew the supervisor by ~3.6 GiB. The share needs the counter at two
instants only, now and at the window's start: the meter keeps a sample only when the one before
it is at least a bucket (window / BUCKETS) older than the previous kept one, and otherwise
overwrites the newest. Kept samples are a bucket apart, so a window holds at most BUCKETS + 2
of them (one before its start, the newest). Where samples come at least a bucket apart (1 s
samples and windows up to BUCKETS seconds) every sample is kept and the share is the unbounded
one's exactly; else the sample taken for the window's start is at most one bucket older than
the unbounded meter's, so the share counts at most a bucket's worth of refaults more (never
less: the counter only grows), a 1/BUCKETS-longer window at worst.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence

# the window counts as covered when the oldest kept sample is this share of it old (late ticks)
COVERED = 0.9
BUCKETS = 500  # kept samples per window, at most BUCKETS + 2 (see the module)


def refault_pages(stat: Mapping[str, int]) -> int | None:
    """File refaults (pages) from memory.stat or /proc/vmstat: ``workingset_refault_file``
    (5.9+), else ``workingset_refault`` (before 5.9 anon pages were not refaulted)."""
    got = stat.get("workingset_refault_file")
    return stat.get("workingset_refault") if got is None else got


def board_file_bytes(meminfo: Mapping[str, int]) -> int | None:
    """The board's file cache in bytes: the file LRUs of /proc/meminfo (what lmkd shares by)."""
    try:
        return meminfo["Active(file)"] + meminfo["Inactive(file)"]
    except KeyError:
        return None


def refault_share(refault_pages: int, page_size: int, file_bytes: int) -> float | None:
    """Refaulted bytes as a percent of the file cache; None without a file cache to share."""
    if file_bytes <= 0:
        return None
    return refault_pages * page_size * 100.0 / file_bytes


class RefaultMeter:
    def __init__(self, window_s: float, page_size: int, buckets: int = BUCKETS) -> None:
        self.window_s = window_s
        self.page_size = page_size
        self.bucket_s = window_s / buckets
        self._points: deque[tuple[float, int]] = deque()
        self.last: float | None = None  # the latest share (percent), for status

    def __len__(self) -> int:
        """Samples kept: at most the buckets + 2, whatever the window (see the module)."""
        return len(self._points)

    def add(self, now: float, refaults: int, file_bytes: int) -> float | None:
        """One sample; the share over the window (percent), None until it is covered."""
        pts = self._points
        if pts and refaults < pts[-1][1]:
            pts.clear()  # the counter went back: another group by the same path, start over
        if len(pts) >= 2 and pts[-1][0] - pts[-2][0] < self.bucket_s:
            pts[-1] = (now, refaults)  # the newest is within a bucket of the one kept before
        else:
            pts.append((now, refaults))
        # keep one sample at or before the window's start: the difference spans the window
        while len(pts) >= 2 and now - pts[1][0] >= self.window_s:
            pts.popleft()
        t0, r0 = pts[0]
        if now - t0 < COVERED * self.window_s:
            self.last = None
            return None
        self.last = refault_share(refaults - r0, self.page_size, file_bytes)
        return self.last


class Thrash:
    """The monitor's refault rules: one meter per rule, fed at each sample with the group's
    counters (the sampler's memory.stat) or the board's (``board_read``: /proc)."""

    def __init__(
        self,
        rules: Sequence[tuple[int, str, float]],  # (index, "refaults" | "board_refaults", window)
        page_size: int,
        board_read: Callable[[], tuple[int, int] | None],
    ) -> None:
        self.kinds = {index: kind for index, kind, _ in rules}
        self.meters = {index: RefaultMeter(window, page_size) for index, _, window in rules}
        self.board_read = board_read

    def sample(self, now: float, refaults: int | None, file: int | None) -> dict[int, float]:
        """Each rule's share (percent) over its window, for the rules whose window is covered."""
        board = self.board_read() if "board_refaults" in self.kinds.values() else None
        group = None if refaults is None or file is None else (refaults, file)
        out: dict[int, float] = {}
        for index, meter in self.meters.items():
            got = board if self.kinds[index] == "board_refaults" else group
            if got is not None and (share := meter.add(now, *got)) is not None:
                out[index] = share
        return out

    def now_pct(self, index: int) -> float | None:
        """The rule's latest share (status: "now N%"), rounded; None before its window."""
        meter = self.meters.get(index)
        return None if meter is None or meter.last is None else round(meter.last, 1)

    def signature(self, step: float) -> tuple[tuple[int, str], ...]:
        """The shares in ``step``-point buckets: the published state changes with them."""
        return tuple(
            (i, "" if m.last is None else str(int(m.last // step))) for i, m in self.meters.items()
        )
