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

Bounded (issue 43 item 4): the policy accepts any window (``leak > 1KB/s for 8760h``), and a
detector that kept every sample grew without end. Least squares needs only each point set's
count, means and (co)moments, so samples closer than a bucket (window / BUCKETS) to the first
of their bucket are folded into it (Welford's update); a bucket leaves once its newest sample
is older than the window, and a bucket goes to the third its mean time falls in. Where samples
come at least a bucket apart (1 s samples and windows up to BUCKETS seconds) each bucket is
one sample and the slope is the unbounded one's exactly; else a third's edges move by at most
a bucket and the window reaches back at most a bucket further.
"""

from __future__ import annotations

from collections import deque

# the window counts as covered when the samples span this share of it (jitter, late ticks)
COVERED = 0.9
MIN_POINTS = 6  # two per third at least
BUCKETS = 500  # buckets per window, at most BUCKETS + 2 kept (see the module)


class _Bucket:
    """Samples folded together: their count, time span, means and (co)moments."""

    __slots__ = ("c_tv", "first", "last", "m2_t", "mean_t", "mean_v", "n")

    def __init__(self, t: float, v: int) -> None:
        self.first = self.last = self.mean_t = t
        self.mean_v = float(v)
        self.n = 1
        self.m2_t = self.c_tv = 0.0  # sum (t - mean_t)^2, sum (t - mean_t)(v - mean_v)

    def add(self, t: float, v: int) -> None:
        self.n += 1
        self.last = t
        dt = t - self.mean_t
        self.mean_t += dt / self.n
        self.mean_v += (v - self.mean_v) / self.n
        self.m2_t += dt * (t - self.mean_t)
        self.c_tv += dt * (v - self.mean_v)


class LeakDetector:
    def __init__(self, window_s: float, buckets: int = BUCKETS) -> None:
        self.window_s = window_s
        self.bucket_s = window_s / buckets
        self._buckets: deque[_Bucket] = deque()

    def __len__(self) -> int:
        """Buckets kept: at most BUCKETS + 2, whatever the window (see the module)."""
        return len(self._buckets)

    def add(self, now: float, anon_bytes: int) -> None:
        buckets = self._buckets
        if buckets and now - buckets[-1].first < self.bucket_s:
            buckets[-1].add(now, anon_bytes)
        else:
            buckets.append(_Bucket(now, anon_bytes))
        while buckets and now - buckets[0].last > self.window_s:
            buckets.popleft()

    def slope(self) -> float | None:
        """Sustained growth in bytes per second (the slowest third of the window), or None
        while the window is not yet covered."""
        buckets = list(self._buckets)
        if not buckets or sum(b.n for b in buckets) < MIN_POINTS:
            return None
        t0, span = buckets[0].first, buckets[-1].last - buckets[0].first
        if span < COVERED * self.window_s:
            return None
        thirds: list[list[_Bucket]] = [[], [], []]
        for b in buckets:
            thirds[min(int(3 * (b.mean_t - t0) / span), 2)].append(b)
        slopes = [_least_squares(part) for part in thirds]
        known = [s for s in slopes if s is not None]
        return min(known) if len(known) == len(thirds) else None


def _least_squares(buckets: list[_Bucket]) -> float | None:
    """The least-squares slope of the buckets' samples; None for fewer than two distinct
    times. Each bucket adds its own moments and its mean's distance from the whole's (the
    parallel form of the variance): one sample a bucket is the plain two-pass formula."""
    n = sum(b.n for b in buckets)
    if n < 2:
        return None
    mean_t = sum(b.n * b.mean_t for b in buckets) / n
    mean_v = sum(b.n * b.mean_v for b in buckets) / n
    var = sum(b.m2_t + b.n * (b.mean_t - mean_t) ** 2 for b in buckets)
    if var == 0:
        return None
    return sum(b.c_tv + b.n * (b.mean_t - mean_t) * (b.mean_v - mean_v) for b in buckets) / var
