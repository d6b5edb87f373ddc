"""The real engine (llama.cpp built by scripts/engine-setup) under real memory limits.

Engine tier: these tests live in the kernel tier's directory and carry both markers (`kernel`
for the guest, `engine` for the llama.cpp build and models in the engine cache), so they run
in the kernel guest (2 GiB RAM, TCG) and are deselected on the host. In CI a missing build or
model fails them (tests/vm/requirements.py). Guest speed (notes/engine.md): tiny model ~28
tok/s; the 1.1 GiB model ~0.1 tok/s, so it is asked for 2 tokens at -c 2048.

Each run drops the page cache first: file pages are charged to the cgroup that faults them in
(cgroup-v2.rst "Memory Ownership"), so a warm cache from an earlier run would hide the weights
from memory.peak, and the estimate is for a cold start.
"""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from engine.paths import BIG, COMPLETION, SIMPLE, SMALL, TINY
from helpers.cgroups import ScratchSlice
from helpers.cold import cold

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
ALL = ("memory", "cpu", "cpuset", "io", "pids")
TINY_ARGV = (str(COMPLETION), "-m", str(TINY), "-p", "hello world", "-n", "8", "-t", "2",
             "-c", "512", "-no-cnv", "--ignore-eos", "-lv", "4")  # fmt: skip
# npu-chat's shape (policies/npu-chat.toml) scaled to the guest: 2 GiB of RAM in all
NPU_CHAT = """
[memory]
high = "{high}"
max = "{max}"
swap_max = "0"
oom_group = true
[engine]
kind = "llama.cpp"
max_context_tokens = 2048
[[pressure]]
when = "memory some 150ms/2s"
do = ["log"]
cooldown = "5s"
[[pressure]]
when = "memory full 500ms/2s"
for = "4s"
do = ["log"]
cooldown = "15s"
"""


@pytest.fixture
def out_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where measured numbers are kept: beside the junit xml (the harness's results directory,
    shared with the host: out/test-results/<stamp>/kernel), else the test's tmp_path."""
    xml = getattr(request.config.option, "xmlpath", None)
    return Path(xml).parent if xml else tmp_path


def _policy(tmp_path: Path, s: ScratchSlice, high: str, max_: str, name: str = "chat") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\nslice = "{s.name}"\n'
        + textwrap.dedent(NPU_CHAT.format(high=high, max=max_))
    )
    return path


def _governor(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "governor", *args],
        capture_output=True, text=True, errors="replace", timeout=timeout, cwd=REPO,
        check=False,
    )  # fmt: skip


def _drop_caches() -> None:
    subprocess.run(["sync"], check=False)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.engine(binary=COMPLETION, paths=(TINY, SIMPLE))
def test_tiny_model_launch_reports_speed_peak_and_estimate(
    tmp_path: Path, scratch_slice: ScratchSlice, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(tmp_path / "run"))  # its own learned peaks
    policy = _policy(tmp_path, scratch_slice, "400M", "512M")
    report = tmp_path / "report.json"
    _drop_caches()
    res = _governor("launch", "--policy", str(policy), "--report", str(report), "--", *TINY_ARGV)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["memory_peak"] > 5 * MIB
    est = data["extra"]["estimate"]
    assert est["fits"] and est["ctx"] == 512
    # the tiny model's timing lines, parsed by bench, from the same stderr
    from governor.bench.timings import parse_timings

    t = parse_timings(res.stderr)
    assert t.prefill_tps and t.decode_tps and t.decode_tokens == 7
    # issue 45 item 3: the run's memory.peak is learned, and `estimate` of the same command
    # line shows it beside the formula's total
    learned = data["extra"]["learned"]
    assert {k: learned[k] for k in ("peak", "runs", "estimate")} == {
        "peak": data["memory_peak"], "runs": 1, "estimate": est["total"]}  # fmt: skip
    # a peak > 25 % from the formula is said once ("far"): after the cache drop above the
    # engine's own file pages are charged too (a CI run: 30.8 MiB measured, 23.9 estimated)
    if "far" in learned:
        assert "measured peak" in learned["far"], learned
    shown = _governor("estimate", "--engine-argv", shlex.join(TINY_ARGV))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert f"{data['memory_peak'] / MIB:.1f} MiB  (measured, 1 run;" in shown.stdout, shown.stdout
    # ... and `governor board` claims it, with its source: `--fits` for the stopped engine, the
    # slice's row while the next launch of the same model and argv runs (-n is no plan word)
    fits = _governor("board", "--json", "--fits", str(policy), "--", *TINY_ARGV)
    assert fits.returncode == 0, fits.stderr[-3000:]
    claim = json.loads(fits.stdout)
    assert (claim["peak_source"], claim["peak_runs"]) == ("measured", 1), claim
    assert claim["peak"] == max(data["memory_peak"], claim["min"]), (claim, data["memory_peak"])
    _board_row_while_it_runs(policy, data["memory_peak"])


def _board_row_while_it_runs(policy: Path, peak: int) -> None:
    """A second launch of TINY_ARGV (generating until its 512-token context is full, ~20 s):
    its `governor board` row claims the peak the first run measured."""
    argv = [*TINY_ARGV]
    argv[argv.index("-n") + 1] = "1000"
    log = policy.with_suffix(".second.log")  # a file: -lv 4 would fill a pipe no one reads
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *argv],
            stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
        )  # fmt: skip
    try:
        row, board = None, None
        for _ in range(60):  # each `governor board` is ~1 s under TCG
            board = _governor("board", "--json", timeout=60)
            rows = json.loads(board.stdout)["slices"] if board.returncode == 0 else []
            row = next((r for r in rows if r["name"] == "chat" and r["state"] == "running"), None)
            if row is not None or proc.poll() is not None:
                break
        assert row is not None, (board, proc.poll())
        assert (row["peak_source"], row["peak_runs"]) == ("measured", 1), row
        assert row["peak"] == max(peak, row["min"]), (row, peak)
        shown = _governor("board", timeout=60)
        line = next(ln for ln in shown.stdout.splitlines() if ln.startswith("chat "))
        assert f"{row['peak'] / MIB:.0f} MiB (measured, 1 run)" in line, shown.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    # its context full (0), or SIGTERM forwarded to the engine (143)
    assert proc.returncode in (0, 143), log.read_text()[-3000:]


@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.engine(binary=COMPLETION, paths=(TINY,))
def test_bench_tiny_writes_csv_json_and_gate_follows_the_peak(
    tmp_path: Path, scratch_slice: ScratchSlice, out_dir: Path
) -> None:
    """Three real runs: one per context (each from a cold page cache) with every output and
    the gate passing, then one whose gate limit is half the measured peak: it fails and names
    the peak its own run measured. The gate's arithmetic and the textfile's highest peak of
    several runs per configuration are host tests (tests/unit/bench, tests/unit/metrics)."""
    policy = _policy(tmp_path, scratch_slice, "400M", "512M")
    out_csv, out_json = tmp_path / "b.csv", tmp_path / "b.json"
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    _drop_caches()
    res = _governor(
        "bench", "--policy", str(policy), "--interval", "0.05", "--ctx", "512", "--ctx", "2048",
        "--drop-caches", "--csv", str(out_csv), "--json", str(out_json),
        "--metrics-textfile", str(textfiles), "--board-memory", "1G", "--max-peak-fraction", "1",
        "--", *TINY_ARGV,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert "GATE FAIL" not in res.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["ctx"] for r in rows] == ["512", "2048"]
    from governor.bench.run import COLUMNS

    assert tuple(rows[0]) == COLUMNS
    for r in rows:
        assert r["exit_status"] == "0" and int(r["peak_bytes"]) > 0
        assert float(r["decode_tps"]) > 0 and float(r["prefill_tps"]) > 0
        assert int(r["samples"]) >= 1 and r["oom_kill"] == "0"
        assert (r["peak_source"], r["series_source"]) == ("memory.peak", "memory.current")
        assert r["quant"] == "Q8_0" and int(r["estimate_bytes"]) > 0
    data = json.loads(out_json.read_text())
    assert len(data["runs"]) == 2 and data["runs"][0]["series"]
    # the node_exporter textfile: one series per configuration, the highest peak of its runs
    from prometheus_client.parser import text_string_to_metric_families

    peaks = {
        s.labels["ctx"]: s.value
        for fam in text_string_to_metric_families((textfiles / "governor_bench.prom").read_text())
        for s in fam.samples
        if s.name == "governor_bench_peak_bytes"
    }
    for ctx in ("512", "2048"):
        assert peaks[ctx] == max(int(r["peak_bytes"]) for r in rows if r["ctx"] == ctx)
    (out_dir / "engine-bench-tiny.csv").write_text(out_csv.read_text())
    # the gate reads the measured peak: a limit at half the smallest one fails the run, and the
    # reason names the peak that run's memory.peak gave (from a cold cache as above: with the
    # model's pages still cached, charged elsewhere, the peak measured 12 MiB instead of 31)
    board = 1 << 30
    fraction = min(int(r["peak_bytes"]) for r in rows) / board * 0.5
    gate_json = tmp_path / "gate.json"
    res = _governor(
        "bench", "--policy", str(policy), "--board-memory", "1G", "--drop-caches",
        "--json", str(gate_json), "--max-peak-fraction", f"{fraction:.6f}", "--", *TINY_ARGV,
    )  # fmt: skip
    assert res.returncode == 1, (fraction, res.stdout, res.stderr[-2000:])
    peak = json.loads(gate_json.read_text())["runs"][0]["peak_bytes"]
    assert f"GATE FAIL: run 1 ({TINY}, -c 512): peak {peak} bytes > " in res.stderr, res.stderr


@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.engine(binary=COMPLETION, paths=(TINY,))
def test_estimate_of_a_truncated_model_is_65(tmp_path: Path) -> None:
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(TINY.read_bytes()[:1000])
    res = _governor("estimate", str(bad), "-c", "512")
    assert res.returncode == 65, res.stderr
    assert res.stderr.startswith("governor: not a readable GGUF model")
    assert "Traceback" not in res.stderr


def _argv(model: Path) -> tuple[str, ...]:
    return (str(COMPLETION), "-m", str(model), "-p", "hi", "-n", "2", "-t", "2", "-c", "2048",
            "-no-cnv", "--ignore-eos", "-lv", "4")  # fmt: skip


@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.parametrize(
    "scale",
    [
        # the small model's estimate at -c 2048: 337 MiB with the CPU_REPACK copy, 255 MiB -nr;
        # the same limits relative to it as the seed's 1700M/1900M to the big model's 2230/1579
        pytest.param(
            (SMALL, 275, 300, 400), marks=pytest.mark.engine(binary=COMPLETION, paths=(SMALL,)),
            id="small",
        ),
        # the seed's scale: the 1.1 GiB model on the 2 GiB board (scripts/test --full)
        pytest.param(
            (BIG, 1700, 1900, 1100),
            marks=(pytest.mark.engine(binary=COMPLETION, paths=(BIG,)), pytest.mark.full),
            id="qwen18b",
        ),
    ],
)  # fmt: skip
def test_big_model_refused_then_forced_then_fits_with_no_repack(
    tmp_path: Path,
    scratch_slice: ScratchSlice,
    out_dir: Path,
    scale: tuple[Path, int, int, int],
) -> None:
    """The promise: a model whose estimate is above memory.max is refused by check and launch
    with the numbers and the -nr fix before anything is created; forced, it runs into the
    limits and the report says how; with -nr it fits and its memory.peak is within 10 % of the
    estimate. scale: the model, memory.high and memory.max in MiB, and the seconds the forced
    run may take (bench --timeout); every step's own timeout stays inside the guest's per-test
    limit (900 s, 1800 s with --full). Before each run only the model's and the engine's pages
    are dropped (helpers/cold.py), not the guest's whole page cache: what the peak must see
    is the engine's own first read (issue 47 item 3)."""
    model, high, max_, seconds = scale
    argv = _argv(model)
    policy = _policy(tmp_path, scratch_slice, f"{high}M", f"{max_}M")
    # 1. refused before anything starts: check and launch say the numbers and the fix
    res = _governor("check", str(policy), "--engine-argv", " ".join(argv), timeout=120)
    assert res.returncode == 65, res.stdout + res.stderr
    assert f"above memory.max {max_} MiB" in res.stderr and "-nr" in res.stderr
    res = _governor("launch", "--policy", str(policy), "--", *argv, timeout=120)
    assert res.returncode == 65, res.stderr[-2000:]
    assert not (scratch_slice.path / "chat").exists()
    # 2. --force: OOM-killed inside the slice, or thrashing at the limit; the report says which
    cold(model, COMPLETION)  # the engine's files only: the governor's imports stay cached
    out_json = tmp_path / "forced.json"
    res = _governor(
        "bench", "--policy", str(policy), "--force", "--interval", "0.5", "--json",
        str(out_json), "--timeout", str(seconds), "--", *argv, timeout=seconds + 60,
    )  # fmt: skip
    forced = json.loads(out_json.read_text())["runs"][0]
    name = model.stem
    (out_dir / f"engine-forced-{name}.json").write_text(
        json.dumps(forced | {"series": []}, indent=2)
    )
    assert forced["outcome"] in ("oom_killed", "thrashed", "throttled", "killed"), forced
    assert forced["peak_bytes"] >= high * MIB  # it ran into the limits
    assert forced["anon_at_peak"] is not None and forced["file_at_peak"] is not None
    # npu-chat's pressure rules (memory some 150ms/2s) see the stall at the limit
    assert forced["pressure_fired"] >= 1, forced
    if forced["outcome"] == "oom_killed":
        assert forced["oom_kill"] >= 1
    else:
        assert forced["memory_events_max"] > 0 or forced["memory_events_high"] > 0
    # 3. -nr with a budget that fits: completes without touching memory.max
    cold(model, COMPLETION)
    nr = (*argv, "-nr")
    report = tmp_path / "nr.json"
    res = _governor(
        "launch", "--policy", str(policy), "--report", str(report), "--", *nr,
        timeout=seconds // 2 + 60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(report.read_text())
    (out_dir / f"engine-nr-{name}.json").write_text(json.dumps(data, indent=2))
    assert data["memory_events_max"] == 0 and data["oom_kill"] == 0
    est = data["extra"]["estimate"]["total"]
    assert abs(est - data["memory_peak"]) <= 0.10 * data["memory_peak"], (est, data["memory_peak"])
