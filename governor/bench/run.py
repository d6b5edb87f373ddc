"""Run an engine under a policy N times through `governor launch`, sampling its cgroup.

Each run is ``python -m governor launch --policy P --report R -- ENGINE...`` (the launch path
users take), with the engine's stderr captured for its timing lines. Meanwhile a thread
samples the policy's group: memory.current and memory.stat (anon, file) every ``interval``
seconds. Three small reads of kernel files per sample; a psutil poller of the process tree
costs several /proc reads per process (perf/sampler_cost.py measures both).

Without the memory controller in the group (a cgroup2 that has none, or `--allow-missing
memory`) there is no memory.peak and no memory.current: the thread falls back to the seed's
sampler, the RSS of the engine's process tree every 50 ms (psutil; anon = RSS - shared, file
= shared). Each row says where its figures came from (``peak_source``, ``series_source``),
and why there are none when there are none (``note``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from governor.bench.sample import (
    SERIES_CGROUP,
    SERIES_RSS,
    EngineTreeReader,
    MemorySeriesRecorder,
    Sample,
    sources,
)
from governor.bench.timings import parse_timings
from governor.engines.llama import parse_llama_argv
from governor.engines.rkllm_memory import parse_memory_usage
from governor.errors import HostError, PermissionDenied

COLUMNS = (
    "run", "model", "quant", "ctx", "peak_bytes", "anon_at_peak", "file_at_peak",
    "prefill_tps", "decode_tps", "wall_s", "exit_status", "oom_kill", "memory_events_max",
    "memory_events_high", "outcome", "pressure_fired", "estimate_bytes", "estimate_error",
    "samples", "device_peak_bytes", "peak_source", "series_source", "note",
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One configuration of the matrix: the argv with its model and context."""

    argv: tuple[str, ...]
    model: str | None
    ctx: int | None


@dataclass
class Row:
    run: int
    model: str | None
    quant: str | None
    ctx: int | None
    peak_bytes: int | None
    anon_at_peak: int | None
    file_at_peak: int | None
    prefill_tps: float | None
    decode_tps: float | None
    wall_s: float
    exit_status: int
    oom_kill: int | None
    memory_events_max: int | None
    memory_events_high: int | None = None
    outcome: str = "ok"  # ok | throttled | thrashed | oom_killed | killed | failed: outcome()
    pressure_fired: int | None = None  # firings of the policy's pressure rules (monitor report)
    estimate_bytes: int | None = None
    estimate_error: float | None = None  # (estimate - peak) / peak
    samples: int = 0
    device_peak_bytes: int | None = None  # DRM + dma-buf peak (monitor report; [device] / rule)
    peak_source: str | None = None  # memory.peak | "<series_source> samples" | None: no peak
    series_source: str | None = None  # memory.current | rss | None: no sample
    note: str | None = None  # why a figure is missing or where it came from instead
    series: list[Sample] = field(default_factory=list)
    error: str | None = None  # a failed run (non-zero status): the last lines of its stderr

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "series"}


# ------------------------------------------------------------------ matrix (pure)

_MODEL_OPTS = ("-m", "--model")
_CTX_OPTS = ("-c", "--ctx-size")


def _with_option(argv: Sequence[str], names: tuple[str, ...], value: str) -> tuple[str, ...]:
    """argv with the option ``names`` set to ``value`` (replaced in place, else appended)."""
    out = list(argv)
    for i, word in enumerate(out):
        if word in names and i + 1 < len(out):
            out[i + 1] = value
            return tuple(out)
        if any(word.startswith(n + "=") for n in names if n.startswith("--")):
            out[i] = f"{word.split('=', 1)[0]}={value}"
            return tuple(out)
    return (*out, names[0], value)


def expand_matrix(
    argv: Sequence[str], models: Sequence[str] = (), ctxs: Sequence[int] = ()
) -> list[Case]:
    """Every (model, ctx) combination of the argv; empty lists keep the argv's own value."""

    base = parse_llama_argv(tuple(argv))
    cases = []
    model_list: list[str | None] = [*models] or [None]
    ctx_list: list[int | None] = [*ctxs] or [None]
    for model in model_list:
        for ctx in ctx_list:
            a: tuple[str, ...] = tuple(argv)
            if model is not None:
                a = _with_option(a, _MODEL_OPTS, model)
            if ctx is not None:
                a = _with_option(a, _CTX_OPTS, str(ctx))
            cases.append(
                Case(argv=a, model=model or base.model, ctx=ctx if ctx is not None else base.ctx)
            )
    return cases


# ------------------------------------------------------------------ outcome, gate (pure)

SIGNALLED = 128  # launch exits 128+N when the engine died of signal N


def outcome(
    exit_status: int, oom_kill: int | None, events_max: int | None, events_high: int | None = None
) -> str:
    """What happened at the memory limit: the kernel's OOM killer fired inside the slice
    (memory.events oom_kill), the engine died of a signal otherwise (a pressure rule's kill),
    it ran into memory.max and reclaim kept it alive (memory.events max > 0: on a board the
    weights' file pages are dropped and re-read, i.e. thrashing), it was throttled and
    reclaimed at memory.high (memory.events high > 0), or nothing of the kind."""
    if oom_kill:
        return "oom_killed"
    if exit_status > SIGNALLED or exit_status < 0:
        return "killed"
    if events_max:
        return "thrashed"
    if events_high and exit_status == 0:
        return "throttled"
    return "ok" if exit_status == 0 else "failed"


# ------------------------------------------------------------------ gate (pure)


def gate(
    rows: Sequence[Row],
    *,
    board_bytes: int,
    max_fraction: float,
    min_decode_tps: float | None,
) -> list[str]:
    """Why the CI gate fails (empty: it passes)."""
    limit = int(board_bytes * max_fraction)
    out = []
    for r in rows:
        where = f"run {r.run} ({r.model}, -c {r.ctx})"
        if r.peak_bytes is not None and r.peak_bytes > limit:
            out.append(
                f"{where}: peak {r.peak_bytes} bytes > {max_fraction:g} x board memory"
                f" {board_bytes} = {limit}"
            )
        if min_decode_tps is not None and (r.decode_tps is None or r.decode_tps < min_decode_tps):
            out.append(f"{where}: decode {r.decode_tps} t/s below the floor {min_decode_tps:g}")
        if r.exit_status != 0:
            out.append(f"{where}: engine exit status {r.exit_status}")
    return out


# ------------------------------------------------------------------ output


def to_csv(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        rec = r.record()
        w.writerow({k: ("" if rec[k] is None else rec[k]) for k in COLUMNS})
    return buf.getvalue()


def to_json(rows: Sequence[Row], meta: dict[str, Any]) -> str:
    return json.dumps(
        {
            **meta,
            "columns": list(COLUMNS),
            "runs": [
                {**r.record(), "series": [[s.t, s.current, s.anon, s.file] for s in r.series]}
                for r in rows
            ],
        },
        indent=2,
    )


def pyplot() -> Any:
    """matplotlib.pyplot with the file-only Agg backend; 69 with a hint when not installed."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError as err:
        raise HostError(
            "--plot needs the python package matplotlib, which is not installed (--plot)",
            hint="pip install 'cgroup-governor[plot]'",
            missing=("matplotlib",),
        ) from err
    return plt


SERIES_LABEL = {
    SERIES_CGROUP: "memory.current of the policy's group",
    SERIES_RSS: "RSS of the engine's process tree (psutil)",
}


def plot_text(rows: Sequence[Row]) -> tuple[str, list[str]]:
    """(the y axis label, the lines written on the chart): which source each run's curve
    came from, and why a run has none (a chart is never empty without a word why)."""
    sources = sorted({r.series_source for r in rows if r.series_source is not None})
    axis = " / ".join(SERIES_LABEL.get(x, x) for x in sources) or "memory"
    notes = []
    for r in rows:
        if not r.series:
            notes.append(f"run {r.run}: no samples: {r.note or 'nothing could be read'}")
        elif r.series_source == SERIES_RSS:
            notes.append(f"run {r.run}: {SERIES_LABEL[SERIES_RSS]}: {r.note}")
    return f"{axis} (MiB)", notes


def plot(rows: Sequence[Row], out: Path) -> None:
    """Memory over time for each run (matplotlib, the `plot` extra): memory.current, else the
    engine's RSS; the label says which, a run without samples says why on the chart."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    ylabel, notes = plot_text(rows)
    for r in rows:
        if not r.series:
            continue
        label = f"#{r.run} {Path(r.model).name if r.model else '?'} -c {r.ctx} ({r.series_source})"
        ax.plot([s.t for s in r.series], [s.current / (1 << 20) for s in r.series], label=label)
    ax.set_xlabel("seconds")
    ax.set_ylabel(ylabel)
    if any(r.series for r in rows):
        ax.legend(fontsize="small")
    for i, line in enumerate(notes):
        ax.text(0.01, 0.98 - 0.05 * i, line, transform=ax.transAxes, va="top", fontsize="small")
    fig.savefig(out, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------ sampling and running


@dataclass(frozen=True)
class RunSpec:
    policy: Path
    governor_args: tuple[str, ...]  # global options before `launch` (--root, --cgroup-root)
    launch_args: tuple[str, ...]  # extra launch options (--allow-missing, --force)
    interval: float
    log_dir: Path | None = None
    timeout: float | None = None
    drop_caches: bool = False  # cold page cache before each run (root)
    state: Path | None = None  # the policy's state.json: the engine's pid for the RSS sampler


def run_case(
    spec: RunSpec, case: Case, run: int, reader: Callable[[], tuple[int, int, int] | None]
) -> Row:
    """One launch of ``case``; the row carries what the report, the samples and stderr say."""
    with tempfile.TemporaryDirectory(prefix="governor-bench-") as tmp:
        report = Path(tmp) / "report.json"
        err_path = (spec.log_dir or Path(tmp)) / f"run-{run}.stderr"
        cmd = [
            sys.executable, "-m", "governor", *spec.governor_args, "launch",
            "--policy", str(spec.policy), "--report", str(report), *spec.launch_args,
            "--", *case.argv,
        ]  # fmt: skip
        if spec.drop_caches:
            drop_page_cache()
        tree = EngineTreeReader(spec.state) if spec.state is not None else None
        recorder = MemorySeriesRecorder(reader, spec.interval, tree).start()
        started = time.monotonic()
        with err_path.open("w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            if tree is not None:
                tree.launch_pid = proc.pid
            try:
                status = proc.wait(timeout=spec.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()  # as subprocess.run(timeout=) does
                proc.wait()
                status = -1
        wall = time.monotonic() - started
        series = recorder.stop()
        data: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(report.read_text())
        text = err_path.read_text(errors="replace")
    timings = parse_timings(text)
    at_peak = max(series, key=lambda s: s.current) if series else None
    peak = data.get("memory_peak")
    peak_source, note = sources(peak is not None, recorder.source, bool(series), spec.state)
    if peak is None and at_peak is not None:
        peak = at_peak.current
    return Row(
        run=run,
        model=case.model,
        quant=None,
        ctx=case.ctx,
        peak_bytes=peak,
        anon_at_peak=at_peak.anon if at_peak else None,
        file_at_peak=at_peak.file if at_peak else None,
        prefill_tps=timings.prefill_tps,
        decode_tps=timings.decode_tps,
        wall_s=round(wall, 3),
        exit_status=int(data.get("exit_code", status)) if data else status,
        oom_kill=data.get("oom_kill"),
        memory_events_max=data.get("memory_events_max"),
        outcome=outcome(
            int(data.get("exit_code", status)) if data else status,
            data.get("oom_kill"),
            data.get("memory_events_max"),
            data.get("memory_events_high"),
        ),
        memory_events_high=data.get("memory_events_high"),
        pressure_fired=_pressure_fired(data),
        samples=len(series),
        # the monitor's DRM + dma-buf peak, else what an RKLLM runtime reports of its own
        device_peak_bytes=(data.get("extra", {}).get("monitor") or {}).get(
            "device_memory_peak_bytes"
        )
        or parse_memory_usage(text),
        peak_source=peak_source,
        series_source=recorder.source if series else None,
        note=note,
        series=series,
        error=None if status == 0 else _tail(text),
    )


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _pressure_fired(report: dict[str, Any]) -> int | None:
    """How often the policy's rules fired during the run (None: no monitor report)."""
    mon = report.get("extra", {}).get("monitor")
    if not isinstance(mon, dict):
        return None
    return sum(int(r.get("fired", 0)) for r in mon.get("rules", []))


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache() -> None:
    """Cold start: file pages are charged to the cgroup that faults them in (cgroup-v2.rst
    "Memory Ownership"); pages a previous run left in the cache would be missing from the next
    run's memory.peak. 3 = page cache + slab (Documentation/admin-guide/sysctl/vm.rst)."""

    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError as err:
        raise PermissionDenied(
            "cannot drop the page cache",
            file=str(DROP_CACHES),
            errno=err.errno,
            hint="--drop-caches needs root",
        ) from err


def default_log_dir() -> Path | None:
    d = os.environ.get("GOVERNOR_BENCH_LOGS")
    return Path(d) if d else None
