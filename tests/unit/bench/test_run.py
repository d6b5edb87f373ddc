"""governor bench's pure parts: llama.cpp timing lines, the matrix, the gate, CSV/JSON.

The timing lines are pasted from real runs (notes/engine.md, this repo's calibration runs)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from governor.bench.run import COLUMNS, Row, expand_matrix, gate, to_csv, to_json
from governor.bench.sample import Sample
from governor.bench.timings import parse_timings

COMMON = """\
0.00.795.370 I common_perf_print:        load time =     795.37 ms
0.00.795.371 I common_perf_print: prompt eval time =     180.42 ms /     9 tokens (   20.05 ms per token,    49.88 tokens per second)
0.00.795.372 I common_perf_print:        eval time =     577.08 ms /    15 runs   (   38.47 ms per token,    25.99 tokens per second)
0.00.795.373 I common_perf_print:       total time =     763.27 ms /    24 tokens
"""
SIMPLE = """\
llama_perf_context_print:        load time =      41.23 ms
llama_perf_context_print: prompt eval time =       2.10 ms /     3 tokens (    0.70 ms per token,  1428.57 tokens per second)
llama_perf_context_print:        eval time =     112.60 ms /    15 runs   (    7.51 ms per token,   133.21 tokens per second)
main: decoded 16 tokens in 0.13 s, speed: 124.19 t/s
"""
OLD = """\
llama_print_timings:        load time =    1021.12 ms
llama_print_timings:      sample time =       5.39 ms /    16 runs   (    0.34 ms per token,  2968.46 tokens per second)
llama_print_timings: prompt eval time =     512.21 ms /     8 tokens (   64.03 ms per token,    15.62 tokens per second)
llama_print_timings:        eval time =    1602.33 ms /    15 runs   (  106.82 ms per token,     9.36 tokens per second)
"""


def test_common_perf_print() -> None:
    t = parse_timings(COMMON)
    assert (t.prefill_tps, t.decode_tps, t.prefill_tokens, t.decode_tokens) == (49.88, 25.99, 9, 15)
    assert t.load_ms == 795.37


def test_llama_perf_context_print() -> None:
    t = parse_timings(SIMPLE)
    assert (t.prefill_tps, t.decode_tps, t.decode_ms) == (1428.57, 133.21, 112.60)


def test_llama_print_timings_ignores_sample_time() -> None:
    t = parse_timings(OLD)
    assert (t.prefill_tps, t.decode_tps) == (15.62, 9.36)


def test_no_timing_lines() -> None:
    t = parse_timings("error: invalid argument: --mlock\n")
    assert t.prefill_tps is None and t.decode_tps is None


def test_last_report_wins() -> None:
    t = parse_timings(COMMON + SIMPLE)
    assert t.decode_tps == 133.21


def test_matrix_replaces_or_appends_model_and_ctx() -> None:
    argv = ("llama-completion", "-m", "a.gguf", "-c", "512", "-n", "4")
    cases = expand_matrix(argv, ["a.gguf", "b.gguf"], [512, 2048])
    assert [(c.model, c.ctx) for c in cases] == [
        ("a.gguf", 512), ("a.gguf", 2048), ("b.gguf", 512), ("b.gguf", 2048),
    ]  # fmt: skip
    assert cases[3].argv == ("llama-completion", "-m", "b.gguf", "-c", "2048", "-n", "4")
    appended = expand_matrix(("llama-simple", "-n", "4"), (), [256])
    assert appended[0].argv == ("llama-simple", "-n", "4", "-c", "256")
    assert expand_matrix(argv)[0].ctx == 512
    eq = expand_matrix(("x", "--ctx-size=64"), (), [128])
    assert eq[0].argv == ("x", "--ctx-size=128")


def _row(peak: int, decode: float | None, status: int = 0) -> Row:
    return Row(
        run=1, model="m.gguf", quant="Q8_0", ctx=512, peak_bytes=peak, anon_at_peak=1,
        file_at_peak=2, prefill_tps=100.0, decode_tps=decode, wall_s=1.0, exit_status=status,
        oom_kill=0, memory_events_max=0,
        series=[Sample(0.0, 10, 5, 5), Sample(0.05, peak, 1, 2)],
    )  # fmt: skip


def test_gate_fraction_floor_and_status() -> None:
    assert gate([_row(700, 20.0)], board_bytes=1000, max_fraction=0.8, min_decode_tps=10) == []
    assert (
        len(gate([_row(801, 20.0)], board_bytes=1000, max_fraction=0.8, min_decode_tps=None)) == 1
    )
    assert len(gate([_row(10, 5.0)], board_bytes=1000, max_fraction=0.8, min_decode_tps=10)) == 1
    assert len(gate([_row(10, None)], board_bytes=1000, max_fraction=0.8, min_decode_tps=10)) == 1
    assert (
        len(gate([_row(10, 50.0, 137)], board_bytes=1000, max_fraction=0.8, min_decode_tps=None))
        == 1
    )


def test_csv_and_json_have_the_documented_columns() -> None:
    rows = [_row(700, 20.0)]
    table = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert tuple(table[0]) == COLUMNS
    assert table[0]["peak_bytes"] == "700" and table[0]["estimate_bytes"] == ""
    data = json.loads(to_json(rows, {"board_bytes": 1000}))
    assert data["board_bytes"] == 1000
    assert set(COLUMNS) <= set(data["runs"][0])
    assert data["runs"][0]["series"][1] == [0.05, 700, 1, 2]


def test_pressure_fired_sums_the_monitor_report() -> None:
    from governor.bench.run import _pressure_fired

    mon = {"rules": [{"rule": 0, "fired": 3}, {"rule": 1, "fired": 1}]}
    assert _pressure_fired({"extra": {"monitor": mon}}) == 4
    assert _pressure_fired({"extra": {"monitor": {"rules": []}}}) == 0
    assert _pressure_fired({}) is None


def test_a_failed_run_keeps_the_tail_of_its_stderr(tmp_path: Path) -> None:
    from governor.bench.run import Case, RunSpec, run_case

    policy = tmp_path / "missing.toml"  # the launch fails: 66, and the row says why
    spec = RunSpec(policy=policy, governor_args=(), launch_args=(), interval=0.05)
    row = run_case(spec, Case(argv=("true",), model=None, ctx=None), 1, lambda: None)
    assert row.exit_status == 66 and row.outcome == "failed"
    assert row.error is not None and "governor: " in row.error and str(policy) in row.error


# ------------------------------------------------------------------ without memory.peak


def test_each_figure_says_where_it_came_from() -> None:
    from governor.bench.sample import SERIES_CGROUP, SERIES_RSS, sources

    state = Path("/run/governor/p/state.json")
    assert sources(True, SERIES_CGROUP, True, state) == ("memory.peak", None)
    peak, note = sources(False, SERIES_CGROUP, True, state)
    assert peak == "memory.current samples" and note is not None and "memory.peak" in note
    peak, note = sources(False, SERIES_RSS, True, state)
    assert peak == "rss samples"
    assert note is not None and "no memory controller" in note and "50 ms" in note
    peak, note = sources(False, None, False, state)
    assert peak is None and note is not None and str(state) in note


def test_the_plot_labels_its_source_and_says_why_a_run_has_no_curve() -> None:
    from governor.bench.run import plot_text
    from governor.bench.sample import SERIES_RSS

    rss = _row(700, 20.0)
    rss.series_source, rss.note = SERIES_RSS, "no memory controller (why)"
    empty = _row(0, None)
    empty.run, empty.series, empty.note = 2, [], "the engine's pid was never published"
    axis, notes = plot_text([rss, empty])
    assert axis == "RSS of the engine's process tree (psutil) (MiB)"
    assert notes == [
        "run 1: RSS of the engine's process tree (psutil): no memory controller (why)",
        "run 2: no samples: the engine's pid was never published",
    ]
    axis, notes = plot_text([empty])
    assert axis == "memory (MiB)" and len(notes) == 1  # never an empty chart without a word


def test_the_text_names_the_peak_source_and_the_note(capsys: pytest.CaptureFixture[str]) -> None:
    from governor.bench.main import BenchResult
    from governor.bench.sample import SERIES_RSS
    from governor.cli.render import show_bench

    row = _row(64 << 20, 20.0)
    row.samples, row.peak_source, row.series_source = 2, "rss samples", SERIES_RSS
    row.note = "no memory controller in the policy's group"
    show_bench(BenchResult(rows=[row], failures=[], board_bytes=1 << 30))
    out = capsys.readouterr().out
    assert "peak 64 MiB (rss samples)" in out and "samples 2 (rss)" in out
    assert "run 1: no memory controller in the policy's group" in out


def test_the_recorder_keeps_the_first_source_that_answers() -> None:
    from governor.bench.sample import SERIES_CGROUP, SERIES_RSS, MemorySeriesRecorder

    asked: list[str] = []

    def cgroup() -> tuple[int, int, int] | None:
        asked.append("cgroup")
        return (100, 60, 40)

    def rss() -> tuple[int, int, int] | None:
        asked.append("rss")
        return (7, 5, 2)

    rec = MemorySeriesRecorder(cgroup, 0.05, rss)
    assert rec._sample() == (100, 60, 40) and rec._sample() == (100, 60, 40)
    assert rec.source == SERIES_CGROUP and asked == ["cgroup", "cgroup"]
    rec = MemorySeriesRecorder(lambda: None, 0.05, rss)
    assert rec._sample() == (7, 5, 2) and rec.source == SERIES_RSS
    assert MemorySeriesRecorder(lambda: None, 0.05)._sample() is None


ENGINE = """
import sys, time
block = bytearray(48 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1  # touched: resident, anonymous
open(sys.argv[1], "w").close()
time.sleep(60)
"""


def test_the_rss_sampler_reads_the_engine_tree_of_this_launch_only(tmp_path: Path) -> None:
    """The seed's sampler: the RSS of the engine named by the state.json, when it is a child
    of this run's launch; a pid from another run's state is not sampled."""
    from governor.bench.sample import EngineTreeReader

    ready = tmp_path / "ready"
    (tmp_path / "engine.py").write_text(ENGINE)
    launch = subprocess.Popen(
        ["/bin/sh", "-c", f'"{sys.executable}" engine.py ready & echo $! > pid; wait'],
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and launch.poll() is None:
            time.sleep(0.02)
        assert ready.exists(), "the stand-in engine did not start"
        engine_pid = int((tmp_path / "pid").read_text())
        state = tmp_path / "state.json"
        reader = EngineTreeReader(state)
        assert reader() is None  # the launch has not started yet
        reader.launch_pid = launch.pid
        assert reader() is None  # nothing published yet
        state.write_text(json.dumps({"engine_pid": os.getpid()}))  # not this launch's child
        assert reader() is None
        state.write_text(json.dumps({"engine_pid": engine_pid}))
        got = reader()
        assert got is not None
        rss, anon, file = got
        assert anon >= 48 << 20 and rss == anon + file
    finally:
        launch.kill()
        with contextlib.suppress(OSError, ValueError):  # no pid file: no engine to kill
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        launch.wait()


def test_an_rkllm_runtimes_reported_memory_is_the_rows_device_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45 item 6: the runtime's memory_usage_mb on stderr, when the monitor saw no
    device memory of its own."""
    import subprocess
    from typing import Any

    from governor.bench import run as bench_run

    class Engine:
        def __init__(self, _cmd: list[str], *, stdout: Any, stderr: Any) -> None:
            stderr.write("I rkllm: rkllm-runtime version: 1.3.0\nmemory_usage_mb: 791.11\n")
            stderr.flush()

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", Engine)
    spec = bench_run.RunSpec(
        policy=tmp_path / "p.toml", governor_args=(), launch_args=(), interval=0.05
    )
    case = bench_run.Case(argv=("llm_demo", "m.rkllm", "64", "128"), model=None, ctx=None)
    row = bench_run.run_case(spec, case, 1, lambda: None)
    assert row.device_peak_bytes == int(791.11 * (1 << 20))
