"""governor bench's pure parts: llama.cpp timing lines, the matrix, the gate, CSV/JSON.

The timing lines are pasted from real runs (notes/engine.md, this repo's calibration runs)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from governor.bench.run import COLUMNS, Row, Sample, expand_matrix, gate, to_csv, to_json
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
