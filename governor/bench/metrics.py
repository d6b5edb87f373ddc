"""`governor bench --metrics-textfile DIR`: the bench rows as a node_exporter textfile
(DIR/governor_bench.prom, replaced atomically), one series per configuration: policy, model
file, quant and -c. Runs of one configuration are summarised (peak: the highest; tokens/s and
wall time: the mean over the runs that produced them; runs counted by outcome).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean

from prometheus_client import CollectorRegistry, Gauge

from governor.bench.run import Row
from governor.metrics.export import write_registry

TEXTFILE = "governor_bench.prom"
LABELS = ("policy", "model", "quant", "ctx")


def _key(policy: str, row: Row) -> tuple[str, str, str, str]:
    model = os.path.basename(row.model) if row.model else ""
    return (policy, model, row.quant or "", "" if row.ctx is None else str(row.ctx))


def registry(policy: str, rows: Sequence[Row], now: float | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)

    def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, [*LABELS, *extra], registry=reg)

    peak = gauge(
        "governor_bench_peak_bytes",
        "highest peak of the runs (memory.peak, else the highest sample: peak_source in --json)",
    )
    estimate = gauge("governor_bench_estimate_bytes", "the GGUF estimate of the configuration")
    prefill = gauge("governor_bench_prefill_tokens_per_second", "mean prompt tokens/s")
    decode = gauge("governor_bench_decode_tokens_per_second", "mean generated tokens/s")
    wall = gauge("governor_bench_wall_seconds", "mean wall time of a run")
    oom = gauge("governor_bench_oom_kills", "memory.events oom_kill summed over the runs")
    runs = gauge(
        "governor_bench_runs", "runs by outcome (ok, throttled, oom_killed...)", ("outcome",)
    )
    stamp = Gauge(
        "governor_bench_timestamp_seconds", "when the bench finished", ["policy"], registry=reg
    )
    groups: dict[tuple[str, str, str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault(_key(policy, row), []).append(row)
    for key, group in groups.items():
        peaks = [r.peak_bytes for r in group if r.peak_bytes is not None]
        if peaks:
            peak.labels(*key).set(max(peaks))
        est = next((r.estimate_bytes for r in group if r.estimate_bytes is not None), None)
        if est is not None:
            estimate.labels(*key).set(est)
        for g, values in (
            (prefill, [r.prefill_tps for r in group if r.prefill_tps is not None]),
            (decode, [r.decode_tps for r in group if r.decode_tps is not None]),
            (wall, [r.wall_s for r in group]),
        ):
            if values:
                g.labels(*key).set(fmean(values))
        oom.labels(*key).set(sum(r.oom_kill or 0 for r in group))
        for outcome in sorted({r.outcome for r in group}):
            runs.labels(*key, outcome).set(sum(r.outcome == outcome for r in group))
    stamp.labels(policy).set(time.time() if now is None else now)
    return reg


def write(directory: Path, policy: str, rows: Sequence[Row]) -> Path:

    return write_registry(directory, TEXTFILE, registry(policy, rows), "--metrics-textfile")
