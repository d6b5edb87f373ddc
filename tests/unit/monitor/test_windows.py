"""The monitor's windows are bounded (issue 43 item 4): a ``refaults`` or ``leak`` window of
any accepted duration keeps a bounded number of points, and the bounded verdicts are the
unbounded ones' where samples come at least a bucket apart, and within a proven bound
otherwise (the unbounded meters are kept here as the reference). The PSI windows (polled
triggers, the shed's own-stall readings) are bounded by the kernel's 10 s window and the
sampler's 0.05 s interval. Needs: nothing."""

from __future__ import annotations

import math
from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor.monitor.leak import BUCKETS as LEAK_BUCKETS
from governor.monitor.leak import COVERED as LEAK_COVERED
from governor.monitor.leak import MIN_POINTS, LeakDetector
from governor.monitor.thrash import BUCKETS, COVERED, RefaultMeter, refault_share

PAGE = 4096
YEAR_S = 8760 * 3600.0  # `refaults > 50%/8760h`, accepted by the policy
FILE = 200 << 20


def test_a_year_long_refault_window_keeps_a_bounded_number_of_points() -> None:
    meter = RefaultMeter(YEAR_S, PAGE)
    for i in range(1_000_000):  # 11.6 days of 1 s samples, all inside the window
        meter.add(float(i), i * 3, FILE)
    assert len(meter) <= 512
    assert BUCKETS + 2 <= 512


def test_a_year_long_leak_window_keeps_a_bounded_number_of_points() -> None:
    det = LeakDetector(YEAR_S)
    for i in range(1_000_000):
        det.add(float(i), 1000 + 7 * i)
    assert len(det) <= 512
    assert LEAK_BUCKETS + 2 <= 512


def test_a_covered_year_long_window_still_answers() -> None:
    """Samples 10 minutes apart over 1.1 years: the share over a year is the counter's growth
    over a year (within a bucket), the leak's slope the steady rate."""
    meter, det = RefaultMeter(YEAR_S, PAGE), LeakDetector(YEAR_S)
    share = slope = None
    for i in range(58_000):
        t = i * 600.0
        share = meter.add(t, i, FILE)
        det.add(t, 5 * i)
        slope = det.slope()
    assert len(meter) <= 512 and len(det) <= 512
    exact = refault_share(int(YEAR_S // 600), PAGE, FILE)
    assert share is not None and exact is not None
    assert exact <= share <= exact * (1 + 2 / BUCKETS)
    assert slope is not None and abs(slope - 5 / 600) < 1e-9


# ------------------------------------------------------------------ refaults against the reference


class _UnboundedMeter:
    """The meter before issue 43: every sample kept. Returns (share, the reference sample's
    time) so the property can state its bound."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.pts: deque[tuple[float, int]] = deque()
        self.all: list[tuple[float, int]] = []  # since the last reset, for the bound

    def add(self, now: float, refaults: int) -> tuple[float | None, float]:
        pts = self.pts
        if pts and refaults < pts[-1][1]:
            pts.clear()
            self.all.clear()
        pts.append((now, refaults))
        self.all.append((now, refaults))
        while len(pts) >= 2 and now - pts[1][0] >= self.window_s:
            pts.popleft()
        t0, r0 = pts[0]
        if now - t0 < COVERED * self.window_s:
            return None, t0
        return refault_share(refaults - r0, PAGE, FILE), t0

    def counter_before(self, t: float) -> int:
        """The counter at the latest sample at or before ``t`` (the first one if none)."""
        before = [r for s, r in self.all if s <= t]
        return before[-1] if before else self.all[0][1]


def _samples(min_gap: float) -> st.SearchStrategy[list[tuple[float, int, bool]]]:
    """(gap in windows, refaults added, the counter resets) per sample."""
    return st.lists(
        st.tuples(
            st.floats(min_value=min_gap, max_value=0.5, allow_nan=False),
            st.integers(min_value=0, max_value=5000),
            st.integers(min_value=0, max_value=30).map(lambda x: x == 0),
        ),
        min_size=1,
        max_size=120,
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    window=st.floats(min_value=2.0, max_value=1e6),
    buckets=st.integers(min_value=2, max_value=64),
    # gaps > 0: the loop's clock is monotonic and it samples at an interval, never twice at
    # one instant (two samples at one time tie the reference sample the bound is stated by)
    samples=_samples(1e-9),
)
def test_bounded_refault_share_is_exact_at_bucket_spacing_and_bounded_otherwise(
    window: float, buckets: int, samples: list[tuple[float, int, bool]]
) -> None:
    """Each sample: the bounded meter's share equals the unbounded one's when every gap so far
    is at least a bucket; otherwise it is at least the unbounded share and at most the share
    measured from the latest sample a bucket before the unbounded meter's reference."""
    bounded, ref = RefaultMeter(window, PAGE, buckets=buckets), _UnboundedMeter(window)
    bucket = window / buckets
    t, counter, spaced = 0.0, 0, True
    for i, (gap, added, reset) in enumerate(samples):
        if i:
            before, t = t, t + gap * window
            spaced = spaced and t - before >= bucket
        counter = 0 if reset else counter + added
        got = bounded.add(t, counter, FILE)
        want, t0 = ref.add(t, counter)
        if reset:
            spaced = True  # both start over
        assert len(bounded) <= buckets + 2
        assert (got is None) == (want is None)
        if got is None or want is None:
            continue
        if spaced:
            assert got == want
            continue
        upper = refault_share(counter - ref.counter_before(t0 - bucket), PAGE, FILE)
        assert upper is not None
        assert want - 1e-9 <= got <= upper + 1e-9


# ------------------------------------------------------------------ leak against the reference


def _unbounded_slope(pts: list[tuple[float, float]], window: float) -> float | None:
    """The detector before issue 43 (every sample in the window kept)."""
    now = pts[-1][0]
    pts = [p for p in pts if now - p[0] <= window]
    if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < LEAK_COVERED * window:
        return None
    t0, span = pts[0][0], pts[-1][0] - pts[0][0]
    thirds: list[list[tuple[float, float]]] = [[], [], []]
    for t, v in pts:
        thirds[min(int(3 * (t - t0) / span), 2)].append((t, v))
    slopes = []
    for part in thirds:
        n = len(part)
        if n < 2:
            return None
        mt, mv = sum(t for t, _ in part) / n, sum(v for _, v in part) / n
        var = sum((t - mt) ** 2 for t, _ in part)
        if var == 0:
            return None
        slopes.append(sum((t - mt) * (v - mv) for t, v in part) / var)
    return min(slopes)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    window=st.floats(min_value=10.0, max_value=1e6),
    buckets=st.integers(min_value=3, max_value=64),
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0.001, max_value=0.2),
            st.floats(min_value=0.0, max_value=1e6),
        ),
        min_size=6,
        max_size=150,
    ),
    spaced=st.booleans(),
)
def test_bounded_leak_slope_is_exact_at_bucket_spacing_and_within_the_rates_otherwise(
    window: float, buckets: int, steps: list[tuple[float, float]], spaced: bool
) -> None:
    """Samples a bucket apart or more: the slope is the unbounded one's. Closer: the slope of
    any subset of samples is a positive mix of their pairwise slopes, so both slopes lie
    between the slowest and the fastest growth between two samples, and the verdict of any
    threshold outside that range is the same."""
    det = LeakDetector(window, buckets=buckets)
    bucket = window / buckets
    t, v, pts = 0.0, 1e9, []
    rates: list[float] = []
    for i, (gap, rate) in enumerate(steps):
        if i:
            before = t
            t += max(gap * window, bucket) if spaced else gap * window
            while spaced and t - before < bucket:  # the rounding of the sum
                t = math.nextafter(t, math.inf)
            v += rate * (t - before)
            rates.append(rate)
        det.add(t, v)  # type: ignore[arg-type]  # the detector's arithmetic takes floats
        pts.append((t, v))
        assert len(det) <= buckets + 2
        got, want = det.slope(), _unbounded_slope(pts, window)
        if spaced:
            assert (got is None) == (want is None)
            if got is not None and want is not None:
                assert abs(got - want) <= 1e-6 * max(1.0, abs(want))
        elif got is not None:
            lo, hi = min(rates), max(rates)
            tol = 1e-6 * max(1.0, hi)
            assert lo - tol <= got <= hi + tol
