"""Leak detector (pure): the least-squares slope of anon memory over a sliding window.

The seed samples RssAnon every N seconds and calls a sustained positive slope a leak. Here
the samples are the group's ``anon`` from memory.stat (every page of every process in the
slice, the same number /proc/<pid>/smaps_rollup's Anonymous sums per process), fed with the
time they were taken; :meth:`LeakDetector.slope` answers only once the window is covered, so a
model that is still loading is not a leak after one second.

"Sustained" is taken literally: the window is cut into thirds and the answer is the SMALLEST of
their three least-squares slopes. A one-off step (the KV cache memset at context creation, a
batch of requests) lifts the slope of one third only and is not a leak; anon memory that grows
all through the window is, at the rate of its slowest third.
"""

from __future__ import annotations

from collections import deque

# the window counts as covered when the samples span this share of it (jitter, late ticks)
COVERED = 0.9
MIN_POINTS = 6  # two per third at least


class LeakDetector:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, int]] = deque()

    def add(self, now: float, anon_bytes: int) -> None:
        self._points.append((now, anon_bytes))
        while self._points and now - self._points[0][0] > self.window_s:
            self._points.popleft()

    def slope(self) -> float | None:
        """Sustained growth in bytes per second (the slowest third of the window), or None
        while the window is not yet covered."""
        pts = list(self._points)
        if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < COVERED * self.window_s:
            return None
        t0, span = pts[0][0], pts[-1][0] - pts[0][0]
        thirds: list[list[tuple[float, int]]] = [[], [], []]
        for t, v in pts:
            thirds[min(int(3 * (t - t0) / span), 2)].append((t, v))
        slopes = [_least_squares(part) for part in thirds]
        known = [s for s in slopes if s is not None]
        return min(known) if len(known) == len(thirds) else None


def _least_squares(pts: list[tuple[float, int]]) -> float | None:
    """The least-squares slope of (t, v) points; None for fewer than two distinct times."""
    n = len(pts)
    if n < 2:
        return None
    mean_t = sum(t for t, _ in pts) / n
    mean_v = sum(v for _, v in pts) / n
    var = sum((t - mean_t) ** 2 for t, _ in pts)
    if var == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in pts) / var
