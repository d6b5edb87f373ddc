"""Peaks learned from runs (issue 45 item 3, governor/state/peaks.py): recorded under the model
file's identity and the argv's plan key, bounded, validated on read, shown by `governor board`
and `estimate`. Needs: a tmp directory (no kernel)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from governor.board.budget import slice_of_plan
from governor.board.scan import scan as gather
from governor.engines.estimate import estimate, measured_lines
from governor.engines.gguf import GgufInfo, Tensor
from governor.engines.settings import Settings
from governor.launch.launcher import LaunchReport
from governor.operate.boardview import render, view
from governor.plan.model import Plan
from governor.rundir.state import Publisher, applied
from governor.state import peaks, store
from governor.state.peaks import learned, peak_key, record_peak
from governor.state.store import MODELS_MAX, PLANS_MAX, RUNS_MAX, Store
from governor.supervise.learn import learn_peak, measured_peak

from ..operate.test_board import board, plan_dict

MIB = 1 << 20


def model(tmp_path: Path, data: bytes = b"GGUF" * 16) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    return path


def test_the_key_is_the_files_identity_and_the_argv_in_any_order_without_the_model(
    tmp_path: Path,
) -> None:
    m = model(tmp_path)
    launch = peak_key(m, ["/usr/bin/llama-cli", "-m", str(m), "-c", "512", "-nr"])
    # `governor estimate MODEL --engine-argv 'llama-cli -nr --ctx-size 512'` builds this argv
    estimate = peak_key(m, ["llama-cli", "-nr", "--ctx-size", "512", "-m", "./m.gguf"])
    assert launch is not None and launch == estimate
    assert peak_key(m, ["llama-cli", "-m", str(m), "-c", "1024", "-nr"]) != launch
    assert peak_key(m, ["llama-server", "-m", str(m), "-c", "512", "-nr"]) != launch
    st = m.stat()
    m.write_bytes(b"GGUF" * 32)  # a rewritten model is a new model
    assert peak_key(m, ["llama-cli", "-m", str(m), "-c", "512", "-nr"]) != launch
    os.utime(m, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert peak_key(tmp_path / "gone.gguf", ["llama-cli"]) is None


def test_runs_are_kept_bounded_and_the_learned_peak_is_their_highest(tmp_path: Path) -> None:
    for i in range(RUNS_MAX + 3):
        got, _far = record_peak(tmp_path, "k", (100 + i) * MIB, 110 * MIB, now=float(i))
    assert (got.peak, got.runs) == ((100 + RUNS_MAX + 2) * MIB, RUNS_MAX)
    for i in range(PLANS_MAX + 2):  # one model's plans: the ones recorded last
        record_peak(tmp_path, f"k plan{i}", 100 * MIB, None, now=500.0 + i)
    entries, note = Store(tmp_path).read()
    assert note is None and sorted(entries["k"]["peaks"]) == sorted(
        f"plan{i}" for i in range(2, PLANS_MAX + 2)
    )
    for i in range(MODELS_MAX + 5):
        record_peak(tmp_path, f"model{i} plan", 100 * MIB, None, now=1000.0 + i)
    entries, note = Store(tmp_path).read()
    assert note is None and len(entries) == MODELS_MAX
    assert "k" not in entries and "model0" not in entries and f"model{MODELS_MAX + 4}" in entries
    got2, _ = learned(tmp_path, f"model{MODELS_MAX + 4} plan")
    assert got2 is not None and got2.text() == "peak 100 MiB (measured, 1 run)"


def test_a_bad_store_is_one_note_and_the_next_run_replaces_it(tmp_path: Path) -> None:
    path = tmp_path / store.FILE
    entry = {"at": 1.0, "peaks": {"": {"runs": [-1], "at": 1.0}}}
    for bad in (b"\xff", b"{", b"[]", json.dumps({"format": 1, "models": {"k": entry}})):
        path.write_bytes(bad if isinstance(bad, bytes) else bad.encode())
        got, note = learned(tmp_path, "k")
        assert got is None and note is not None and str(path) in note
    record_peak(tmp_path, "k", 5 * MIB, None)
    assert learned(tmp_path, "k") == (peaks.Learned(5 * MIB, 1, None), None)


def test_a_peak_far_from_the_formula_is_said_once(tmp_path: Path) -> None:
    _got, far = record_peak(tmp_path, "k", 100 * MIB, 200 * MIB)
    assert far is not None and "2.00x the measured peak 100 MiB (measured, 1 run)" in far
    assert record_peak(tmp_path, "k", 100 * MIB, 200 * MIB)[1] is None  # once
    assert record_peak(tmp_path, "near", 100 * MIB, 120 * MIB)[1] is None  # within 25 %


def report(**kw: object) -> LaunchReport:
    base: dict[str, object] = dict(
        policy="chat", cgroup="g", argv=[], pid=1, exit_code=0, signal=None, signal_name=None,
        memory_peak=612 * MIB, oom_kill=0, oom_group_kill=0, memory_events_max=0,
        memory_events_high=0, cpu_usage_usec=None, wall_seconds=1.0,
    )  # fmt: skip
    return LaunchReport(**{**base, **kw})  # type: ignore[arg-type]  # the fields above


def test_the_supervisor_records_memory_peak_else_the_sampled_peak_never_a_limits(
    tmp_path: Path,
) -> None:
    assert measured_peak(report()) == 612 * MIB
    sampled = report(memory_peak=None, extra={"monitor": {"sampler": {"max_current": 9 * MIB}}})
    assert measured_peak(sampled) == 9 * MIB
    assert measured_peak(report(oom_kill=1)) is None  # an OOM kill measured the limit
    assert measured_peak(report(memory_events_max=3)) is None
    r = report()
    learn_peak({"peak_key": "k", "estimate": {"total": 700 * MIB}}, r, tmp_path)
    assert r.extra["learned"] == {"peak": 612 * MIB, "runs": 1, "estimate": 700 * MIB}
    assert learned(tmp_path, "k")[0] == peaks.Learned(612 * MIB, 1, 700 * MIB)


def test_the_board_claims_the_measured_peak_and_says_so(tmp_path: Path) -> None:
    root, cg, run = board(tmp_path)
    plan = plan_dict("chat", "interactive", min="104857600", max="1073741824")
    state = applied(Plan.from_dict(plan), policy_path=None, created=[], started_at=1.0).to_json()
    model_ = {"model": "m", "total": 700 * MIB, "measured": 612 * MIB, "measured_runs": 3}
    state.update(source="launch", pid=1, model=model_)
    Publisher(run, "chat").publish(state)
    proc = root / "proc/1"
    proc.mkdir()
    (proc / "cmdline").write_bytes(b"python\0-m\0governor\0launch\0")
    got = gather(run=run, cgroup_root=cg, root=root)
    (c,) = got.slices
    assert (c.peak, c.peak_source, c.peak_runs) == (612 * MIB, "measured", 3)
    assert "612 MiB (measured, 3 runs)" in render(view(got.budget, list(got.slices)))
    new = slice_of_plan(Plan.from_dict(plan), estimate=700 * MIB, measured=(612 * MIB, 2))
    assert (new.peak, new.peak_text) == (612 * MIB, "measured, 2 runs")
    assert slice_of_plan(Plan.from_dict(plan), estimate=700 * MIB).peak_source == "estimate"


def test_estimate_shows_the_measured_peak_beside_the_formula() -> None:
    t = (Tensor("blk.0.ffn_up.weight", "F16", 1024 * 1024, 2 * MIB, 1024),)
    info = GgufInfo(
        path="m.gguf", file_bytes=2 * MIB, architecture="llama", n_layer=1, n_embd=1024,
        n_head=8, n_head_kv=8, n_ctx_train=4096, vocab=1000, key_length=128,
        value_length=128, file_type="F16", tensors=t,
    )  # fmt: skip
    est = replace(estimate(info, Settings(ctx=2048), family="none"), measured=(612 * MIB, 3))
    (line,) = measured_lines(est, 10)
    ratio = f"{est.total / (612 * MIB):.2f}"
    assert (
        line == f"  peak          612.0 MiB  (measured, 3 runs; the formula's total is {ratio}x it)"
    )
    assert est.to_dict()["measured"] == {"peak": 612 * MIB, "runs": 3}


def test_a_run_records_in_the_state_dir_and_the_next_launch_reads_it_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's learn_peak (no directory: the state directory) and launch's
    learned_extra meet in $GOVERNOR_STATE_DIR, never the run dir (a tmpfs)."""
    from governor.api.launch import learned_extra
    from governor.state.store import state_dir

    state, run = tmp_path / "state", tmp_path / "run"
    monkeypatch.setenv("GOVERNOR_STATE_DIR", str(state))
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    m = model(tmp_path)
    argv = ("llama-cli", "-m", str(m), "-c", "512")
    est = {"model": str(m), "total": 700 * MIB}
    extra = learned_extra(est, argv, state_dir())
    assert "measured" not in extra["estimate"]
    learn_peak(extra, report())  # what the supervisor calls at the engine's exit
    again = learned_extra(est, argv, state_dir())
    assert (again["estimate"]["measured"], again["estimate"]["measured_runs"]) == (612 * MIB, 1)
    assert (state / store.FILE).is_file() and not run.exists()
