"""The Prometheus collector (governor/metrics/): names, labels and values from a published
state and a fake cgroup tree; the text exposition parsed back with prometheus_client's own
parser; the textfile written atomically; `--metrics` addresses; the CLI's errors."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from governor.api import host as api_host
from governor.bench import metrics as bench_metrics
from governor.bench.run import Row
from governor.board.budget import reserve_for
from governor.errors import HostError, PolicyNotFound
from governor.kernel.procfs import ProcFs
from governor.metrics.export import TEXTFILE, exposition, serve, write_textfile
from governor.metrics.listen import parse_listen
from governor.plan.model import Plan
from governor.rundir.journal import Journal
from governor.rundir.state import Publisher, RunState

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"

POLICY = """name = "mx"
[memory]
high = "1G"
max = "1536M"
[[pressure]]
when = "memory some 150ms/2s"
do = ["log", "reclaim 64M"]
cooldown = "5s"
"""

KERNEL = {
    "memory.current": "700000000\n",
    "memory.peak": "900000000\n",
    "memory.stat": "anon 500000000\nfile 200000000\ninactive_file 150000000\n",
    "memory.events": "low 0\nhigh 7\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n",
    "memory.min": "0\n",
    "memory.low": "0\n",
    "memory.swap.max": "max\n",
    "memory.pressure": "some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\n"
    "full avg10=0.50 avg60=0.20 avg300=0.05 total=1250000\n",
    "cpu.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=4000000\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    "io.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=300000\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=100000\n",
    "cpu.stat": "usage_usec 12500000\nuser_usec 10000000\nsystem_usec 2500000\n"
    "nr_periods 0\nnr_throttled 3\nthrottled_usec 750000\n",
    "pids.current": "5\n",
    "cgroup.events": "populated 1\nfrozen 0\n",
}


def _slice(tmp_path: Path) -> tuple[Plan, Path, Path]:
    """A fake cgroup tree with the policy applied and the kernel files above; its state
    published in run/ (as `governor apply` would)."""
    cg = tmp_path / "cg"
    shutil.copytree(HOSTS / "rk3588" / "sys" / "fs" / "cgroup", cg)
    policy = tmp_path / "mx.toml"
    policy.write_text(POLICY)
    plan = api_host.check(policy, api_host.HostOptions(root=HOSTS / "rk3588", cgroup_root=cg))
    group = cg / plan.group
    group.mkdir(parents=True)
    for w in plan.writes:
        (group / w.file).write_text(w.value + "\n")
    for name, text in KERNEL.items():
        (group / name).write_text(text)
    run = tmp_path / "run"
    return plan, group, run


def _publish(run: Path, plan: Plan, **extra: Any) -> None:
    Publisher(run, plan.policy).publish(
        {"policy": plan.policy, "source": "apply", "pid": None, "plan": plan.to_dict(), **extra}
    )


def _samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _get(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_every_series_has_its_name_labels_and_kernel_value(tmp_path: Path) -> None:
    plan, _group, run = _slice(tmp_path)
    _publish(
        run,
        plan,
        restarts=2,
        rules=[{"rule": 1, "when": "memory some 150ms/2s", "state": "armed", "fired": 3}],
        action_totals=[
            {"rule": 1, "action": "log", "count": 3},
            {"rule": 1, "action": "reclaim", "count": 3},
        ],
        model={"model": "/models/qwen-q4.gguf", "quant": "Q4_0", "total": 1234567},
        shed_totals=[
            {"victim": "npu-batch", "step": "throttle", "count": 2},
            {"victim": "npu-batch", "step": "release", "count": 1},
        ],
    )
    s = _samples(exposition(run))
    p = {"policy": "mx"}
    assert _get(s, "governor_engine_up", **p) == 1
    assert _get(s, "governor_engine_restarts_total", **p) == 2
    assert _get(s, "governor_memory_bytes", kind="current", **p) == 700000000
    assert _get(s, "governor_memory_bytes", kind="anon", **p) == 500000000
    assert _get(s, "governor_memory_bytes", kind="file", **p) == 200000000
    assert _get(s, "governor_memory_bytes", kind="working_set", **p) == 550000000
    assert _get(s, "governor_memory_bytes", kind="peak", **p) == 900000000
    assert _get(s, "governor_memory_limit_bytes", limit="max", **p) == plan.limit("memory.max")
    assert _get(s, "governor_memory_limit_bytes", limit="high", **p) == plan.limit("memory.high")
    assert _get(s, "governor_memory_limit_bytes", limit="min", **p) == 0
    assert math.isinf(_get(s, "governor_memory_limit_bytes", limit="swap_max", **p))
    assert _get(s, "governor_memory_events_total", event="oom_kill", **p) == 1
    assert _get(s, "governor_memory_events_total", event="high", **p) == 7
    assert not [
        k
        for k in s
        if k[0] == "governor_memory_events_total" and ("event", "oom_group_kill") in k[1]
    ]
    assert _get(s, "governor_pressure_memory_waiting_seconds_total", **p) == 2.5
    assert _get(s, "governor_pressure_memory_stalled_seconds_total", **p) == 1.25
    assert _get(s, "governor_pressure_cpu_waiting_seconds_total", **p) == 4.0
    assert _get(s, "governor_pressure_io_stalled_seconds_total", **p) == 0.1
    assert _get(s, "governor_cpu_usage_seconds_total", **p) == 12.5
    assert _get(s, "governor_cpu_throttled_seconds_total", **p) == 0.75
    assert _get(s, "governor_pids_current", **p) == 5
    assert _get(s, "governor_rule_firings_total", rule="1", **p) == 3
    assert _get(s, "governor_actions_total", rule="1", action="reclaim", **p) == 3
    assert _get(s, "governor_shed_total", victim="npu-batch", step="throttle", **p) == 2
    assert _get(s, "governor_shed_total", victim="npu-batch", step="release", **p) == 1
    assert _get(s, "governor_policy_drift", **p) == 0
    assert _get(s, "governor_model_estimated_bytes", model="qwen-q4.gguf", **p) == 1234567
    info = {"engine": plan.engine.kind, "model": "qwen-q4.gguf", "quant": "Q4_0", **p}
    assert _get(s, "governor_engine_info", **info) == 1
    assert [k for k in s if k[0] == "governor_build_info"]
    # the board's figures (issue 36, `governor board`): the estimate is the slice's peak claim
    memtotal = ProcFs().meminfo()["MemTotal"]
    assert _get(s, "governor_board_budget_bytes") == memtotal - reserve_for(memtotal)
    assert _get(s, "governor_board_claimed_bytes", kind="peak") == 1234567
    assert _get(s, "governor_board_claimed_bytes", kind="min") == 0
    # bounded labels: every per-slice series says its policy, and nothing names a pid
    for name, labels in s:
        keys = dict(labels)
        if not name.startswith(("governor_build_info", "governor_board_", "governor_cma_")):
            assert keys.get("policy") == "mx", name
        assert not {"pid", "engine_pid"} & set(keys), name


def test_drift_counts_the_files_that_differ_and_pids_max_unlimited_is_inf(tmp_path: Path) -> None:
    plan, group, run = _slice(tmp_path)
    (group / "memory.max").write_text("1073741824\n")  # an operator's echo behind our back
    (group / "pids.max").write_text("max\n")
    (group / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    _publish(run, plan)
    s = _samples(exposition(run, "mx"))
    assert _get(s, "governor_policy_drift", policy="mx") == 1
    assert math.isinf(_get(s, "governor_pids_max", policy="mx"))
    assert _get(s, "governor_engine_up", policy="mx") == 0


def test_tunes_count_applied_and_rolled_back_from_the_journal(tmp_path: Path) -> None:
    plan, _group, run = _slice(tmp_path)
    _publish(run, plan)
    j = Journal(run / "mx")
    change = [{"cgroup": plan.group, "file": "memory.high", "before": "1", "after": "2"}]
    j.append("tune", change)
    j.append("tune", change)
    j.append("monitor", change)  # the monitor's own set action is not a tune
    j.append("rollback", change, undoes=[2])
    s = _samples(exposition(run))
    assert _get(s, "governor_tunes_total", result="applied", policy="mx") == 2
    assert _get(s, "governor_tunes_total", result="rolled_back", policy="mx") == 1


def test_a_stale_state_is_engine_down_with_no_kernel_series(tmp_path: Path) -> None:
    plan, _group, run = _slice(tmp_path)
    Publisher(run, plan.policy).publish(
        {"policy": "mx", "source": "launch", "pid": 2**22 + 7, "plan": plan.to_dict()}
    )
    s = _samples(exposition(run))
    assert _get(s, "governor_engine_up", policy="mx") == 0
    assert not [k for k in s if k[0] == "governor_memory_bytes"]


def test_the_textfile_is_replaced_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    plan, _group, run = _slice(tmp_path)
    _publish(run, plan)
    out = tmp_path / "textfile"
    out.mkdir()
    (out / TEXTFILE).write_text("# an older scrape\n")
    path = write_textfile(out, run)
    assert path == out / TEXTFILE
    assert [p.name for p in out.iterdir()] == [TEXTFILE]
    assert _get(_samples(path.read_bytes()), "governor_engine_up", policy="mx") == 1


def test_textfile_errors_name_the_directory_or_the_policy(tmp_path: Path) -> None:
    plan, _group, run = _slice(tmp_path)
    _publish(run, plan)
    with pytest.raises(PolicyNotFound, match="no such directory"):
        write_textfile(tmp_path / "nope", run)
    with pytest.raises(PolicyNotFound, match="no governed slice named other"):
        write_textfile(tmp_path, run, "other")
    assert not (tmp_path / TEXTFILE).exists()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("9101", ("127.0.0.1", 9101)),
        ("0.0.0.0:9101", ("0.0.0.0", 9101)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9101", ("::1", 9101)),
    ],
)
def test_listen_addresses(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["", "x", "70000", "::1:9101", "[::1]9101", ":9101", "[zz]:1"])
def test_bad_listen_addresses_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(text)


def test_the_endpoint_serves_the_states_it_is_given_and_a_busy_port_is_69(tmp_path: Path) -> None:
    import urllib.request

    plan, _group, run = _slice(tmp_path)
    state = RunState.read({"policy": "mx", "plan": plan.to_dict(), "restarts": 1})
    ep = serve("127.0.0.1", 0, lambda: [state], run)
    try:
        with urllib.request.urlopen(ep.url, timeout=10) as resp:
            body = resp.read()
        assert _get(_samples(body), "governor_engine_restarts_total", policy="mx") == 1
        with pytest.raises(HostError, match="cannot listen for metrics") as info:
            serve("127.0.0.1", ep.port, lambda: [], run)
        assert info.value.exit_code == 69
    finally:
        ep.close()


def _row(run: int, ctx: int, peak: int, decode: float, outcome: str = "ok") -> Row:
    return Row(
        run=run,
        model="/m/qwen18b.gguf",
        quant="Q8_0",
        ctx=ctx,
        peak_bytes=peak,
        anon_at_peak=None,
        file_at_peak=None,
        prefill_tps=100.0,
        decode_tps=decode,
        wall_s=2.0,
        exit_status=0,
        oom_kill=0,
        memory_events_max=0,
        outcome=outcome,
        estimate_bytes=peak - 10,
    )


def test_bench_rows_become_one_series_per_configuration(tmp_path: Path) -> None:
    rows = [
        _row(1, 512, 1000, 10.0),
        _row(2, 512, 1200, 12.0, "throttled"),
        _row(3, 2048, 3000, 8.0),
    ]
    path = bench_metrics.write(tmp_path, "pol", rows)
    assert [p.name for p in tmp_path.iterdir()] == [bench_metrics.TEXTFILE]
    s = _samples(path.read_bytes())
    cfg = {"policy": "pol", "model": "qwen18b.gguf", "quant": "Q8_0", "ctx": "512"}
    assert _get(s, "governor_bench_peak_bytes", **cfg) == 1200
    assert _get(s, "governor_bench_decode_tokens_per_second", **cfg) == 11.0
    assert _get(s, "governor_bench_runs", outcome="throttled", **cfg) == 1
    assert _get(s, "governor_bench_runs", outcome="ok", **cfg) == 1
    assert _get(s, "governor_bench_peak_bytes", **(cfg | {"ctx": "2048"})) == 3000
    with pytest.raises(PolicyNotFound, match="--metrics-textfile"):
        bench_metrics.write(tmp_path / "nope", "pol", rows)


def test_promtool_check_metrics_accepts_the_exposition(tmp_path: Path) -> None:
    """Prometheus' own linter (Debian's prometheus package, installed by scripts/setup --tests) on a
    full exposition: counter names, units, help texts, +Inf values."""
    import subprocess

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup --tests installs the prometheus package"
    plan, _group, run = _slice(tmp_path)
    _publish(
        run,
        plan,
        rules=[{"rule": 1, "fired": 2}],
        action_totals=[{"rule": 1, "action": "log", "count": 2}],
        model={"model": "/m/q.gguf", "quant": "Q4_0", "total": 5},
    )
    text = exposition(run)
    assert b"governor_memory_limit_bytes" in text and b"+Inf" in text
    out = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    bench = bench_metrics.registry("pol", [_row(1, 512, 1000, 10.0)])
    from prometheus_client import generate_latest

    out = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(bench),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()


def test_under_systemd_the_limits_are_read_from_the_slice_unit_that_carries_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A governor@ service: the engine's group is the service's cgroup (no limits there); the
    policy's limits are on its slice unit, which the published state names."""
    from governor.backends import manager

    plan, group, run = _slice(tmp_path)
    (group / "memory.max").write_text("max\n")  # the service's own cgroup: unlimited
    carrier = group.parent / "governor-mx.slice"
    carrier.mkdir()
    (carrier / "memory.max").write_text(f"{256 << 20}\n")
    (carrier / "memory.high").write_text(f"{200 << 20}\n")
    monkeypatch.setattr(manager, "unit_values", lambda _unit: {"memory.max": str(256 << 20)})
    systemd = {
        "unit": "governor-mx.slice",
        "cgroup": str(carrier.relative_to(tmp_path / "cg")),
        "limits": [
            {"file": "memory.max", "reason": "memory.max", "policy": str(256 << 20)},
        ],
    }
    _publish(run, plan, systemd=systemd)
    s = _samples(exposition(run, "mx"))
    assert _get(s, "governor_memory_limit_bytes", limit="max", policy="mx") == 256 << 20
    assert _get(s, "governor_memory_limit_bytes", limit="high", policy="mx") == 200 << 20


def test_engine_ready_follows_the_published_readiness_and_is_absent_without_a_ready_url(
    tmp_path: Path,
) -> None:
    plan, _group, run = _slice(tmp_path)
    _publish(run, plan)  # an engine that is ready once exec'd: no readiness series
    assert not [k for k in _samples(exposition(run)) if k[0] == "governor_engine_ready"]
    _publish(run, plan, ready=False)  # llama-server still loading
    assert _get(_samples(exposition(run)), "governor_engine_ready", policy="mx") == 0
    _publish(run, plan, ready=True)  # /health answered 200
    assert _get(_samples(exposition(run)), "governor_engine_ready", policy="mx") == 1


def test_the_counters_of_every_rule_and_action_start_at_zero_before_any_firing(
    tmp_path: Path,
) -> None:
    plan, group, run = _slice(tmp_path)
    for name in ("memory.events", "memory.peak"):  # a kernel without these files
        (group / name).unlink()
    _publish(run, plan)  # no rule states, no action totals published yet
    s = _samples(exposition(run))
    p = {"policy": "mx"}
    assert _get(s, "governor_rule_firings_total", rule="0", **p) == 0
    assert _get(s, "governor_actions_total", rule="0", action="log", **p) == 0
    assert _get(s, "governor_actions_total", rule="0", action="reclaim", **p) == 0
    assert [k for k in s if k[0] == "governor_actions_total"] == [
        ("governor_actions_total", frozenset({("rule", "0"), ("action", a), *p.items()}))
        for a in ("log", "reclaim")
    ]
    # a gauge or counter of a file the kernel does not have stays absent, not 0
    assert not [k for k in s if k[0] == "governor_memory_events_total"]
    assert not [k for k in s if k[0] == "governor_memory_bytes" and ("kind", "peak") in k[1]]
