"""perf/qos.py's pure parts (perf/qos_common.py): the chat's step log, speeds, stall seconds, the
solo baseline around a run, the kernel's OOM victims, the bench policies made from the shipped
ones, and the table (the benchmark itself runs in the systemd guest, not in CI)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from perf.qos_common import (
    Run,
    bench_policy,
    cpu_table,
    earlyoom_kills,
    guest_cpu,
    oom_victims,
    parse_chat,
    slow_seconds,
    solo_around,
    step_durations,
    step_speed,
    table,
)

REPO = Path(__file__).resolve().parents[3]


def _shipped(name: str) -> dict[str, object]:
    return tomllib.loads((REPO / "policies" / f"{name}.toml").read_text())


def test_parse_chat_reads_ready_steps_and_done_and_skips_a_torn_line() -> None:
    chat = parse_chat("ready 100.5\nstep 101.0 152\nstep 101.5 156\nstep 10\ndone 2\n")
    assert chat.t0 == 100.5
    assert chat.steps == [(101.0, 152), (101.5, 156)]
    assert chat.done == 2
    assert parse_chat("").t0 is None


def test_step_speed_counts_the_window_and_a_dead_chat_scores_zero_for_the_rest() -> None:
    times = [float(t) for t in range(1, 31)]  # one step a second, t = 1..30
    assert step_speed(times, 20.0, 30.0) == pytest.approx(1.0)
    assert step_speed(times[:24], 20.0, 30.0) == pytest.approx(0.4)  # died at t = 24
    assert step_speed(times, 30.0, 30.0) == 0.0


def test_step_durations_and_slow_seconds() -> None:
    times = [0.0, 1.0, 2.0, 12.0, 13.0, 20.0]
    assert step_durations(times, 1.5) == [1.0, 10.0, 1.0, 7.0]
    # the solo median step is 1 s: steps over 4 s are stalls, 10 + 7
    assert slow_seconds(step_durations(times, 1.5), 1.0, 4.0) == pytest.approx(17.0)


def test_solo_around_takes_the_solo_runs_on_both_sides() -> None:
    solos = [(0, 10.0), (6, 20.0), (12, 30.0)]
    assert solo_around(solos, 3) == pytest.approx(15.0)
    assert solo_around(solos, 8) == pytest.approx(25.0)
    assert solo_around([(0, 10.0)], 3) == pytest.approx(10.0)
    assert solo_around([], 3) is None


def test_oom_victims_names_the_killed_processes() -> None:
    kmsg = (
        "[  1.0] qos-batch invoked oom-killer: gfp_mask=0x140cca\n"
        "[  1.1] Out of memory: Killed process 812 (qos-batch) total-vm:990000kB\n"
        "[  2.0] Memory cgroup out of memory: Killed process 901 (qos-chat) total-vm:1kB\n"
    )
    assert oom_victims(kmsg) == ["qos-batch", "qos-chat"]
    assert oom_victims("nothing here\n") == []


@pytest.mark.parametrize("shed", [False, True])
def test_bench_policies_keep_the_shipped_classes_and_rules(shed: bool) -> None:
    chat_src, batch_src = _shipped("npu-chat"), _shipped("npu-batch")
    mem = {"min": "400M", "high": "1000M", "max": "1200M", "swap_max": "0"}
    chat = tomllib.loads(bench_policy(chat_src, "chat", "q.slice", mem, shed=shed, ncpus=2))
    batch = tomllib.loads(
        bench_policy(batch_src, "batch", "q.slice", {"high": "1GiB"}, shed=shed, ncpus=2)
    )
    assert (chat["name"], chat["slice"], chat["memory"]) == ("chat", "q.slice", mem)
    assert chat["qos"] == chat_src["qos"] and batch["qos"] == batch_src["qos"]
    assert chat["process"] == {"oom_score_adj": 500}
    shedding = [r for r in chat["pressure"] if "shed" in r["do"]]
    assert bool(shedding) is shed  # npu-chat ships shed rules: kept only with shed
    others = [r for r in chat_src["pressure"] if "shed" not in r["do"]]  # type: ignore[attr-defined]
    assert [r for r in chat["pressure"] if "shed" not in r["do"]] == others
    # the io-free rules: all of them (npu-batch's `cpu some` rule sets its cpu.weight)
    assert batch["pressure"] == batch_src["pressure"]
    # [cpu] as shipped, big/LITTLE as the upper/lower half of the guest's CPUs (here 2)
    assert chat["cpu"] == {**chat_src["cpu"], "cpus": "1"}  # type: ignore[dict-item]
    assert batch["cpu"] == {**batch_src["cpu"], "cpus": "0"}  # type: ignore[dict-item]
    assert batch["process"] == {"oom_score_adj": 800, "nice": 10}


def test_guest_cpu_maps_big_and_little_to_halves_of_the_guest() -> None:
    shipped = {"cpu": {"cpus": "big", "weight": 200}}
    assert guest_cpu(shipped, 4) == {"cpus": "2-3", "weight": 200}
    assert guest_cpu({"cpu": {"cpus": "little"}}, 4) == {"cpus": "0-1"}
    assert guest_cpu(shipped, 1) == {"weight": 200}  # one CPU: nothing to pin to
    assert guest_cpu({"cpu": {"cpus": "0,3"}}, 4) == {"cpus": "0,3"}  # explicit: as shipped
    assert guest_cpu({}, 4) == {}


def test_table_has_one_row_per_arm_with_the_median_and_each_run() -> None:
    runs = [
        Run("bare", 1, ratio=0.2, full_s=10.0, slow_s=8.0, bg_done=True),
        Run("bare", 7, ratio=0.8, full_s=2.0, slow_s=1.0, bg_done=True),
        Run("governor", 2, ratio=0.5, kills=["kernel OOM: qos-batch"], actions=["batch: freeze"]),
    ]
    out = table(runs, [Run("solo", 0, speed=3.0), Run("solo", 6, speed=5.0)])
    lines = out.splitlines()
    assert lines[0] == "solo speed (steps/s, t >= 20 s): 3.00 5.00"
    bare = next(ln for ln in lines if ln.startswith("| bare "))
    assert "| 0.50 (0.20 / 0.80)x |" in bare and "| 2 of 2 |" in bare and "| none |" in bare
    gov = next(ln for ln in lines if ln.startswith("| governor "))
    assert "| kernel OOM: qos-batch (1/1) |" in gov and "0 of 1" in gov and "batch: freeze" in gov
    assert not any(ln.startswith("| oomd ") for ln in lines)  # no run, no row


def test_the_chat_kv_cache_grows_linearly_then_stays() -> None:
    from helpers.kvchat import kv_target

    assert [kv_target(t, 150, 550, 40.0) for t in (-1.0, 0.0, 20.0, 40.0, 50.0)] == [
        150, 150, 350, 550, 550,
    ]  # fmt: skip


def test_cpu_table_lists_solo_first_and_the_median_of_each_column() -> None:
    runs = [
        Run("gov+shed", 1, chat_user_s=50.0, chat_sys_s=4.0, chat_wait_s=9.0, kswapd_s=2.0),
        Run("gov+shed", 3, chat_user_s=52.0, chat_sys_s=6.0, chat_wait_s=11.0, kswapd_s=None),
    ]
    runs[0].speed, runs[0].window_s = 18.0, 60.0  # 1080 steps: 54 s of CPU is 50 ms a step
    solo = Run("solo", 0, chat_user_s=58.0, chat_sys_s=1.0, chat_wait_s=0.2)
    out = cpu_table(runs, [solo])
    rows = out.splitlines()[2:]
    assert rows[0].startswith("| solo | 58.0 (58.0) | 1.0 (1.0) | 0.2 (0.2) | - (-) | - (-) |")
    assert rows[1] == (
        "| gov+shed | 51.0 (50.0 / 52.0) | 5.0 (4.0 / 6.0) | 10.0 (9.0 / 11.0) | 2.0 (2.0 / -) "
        "| 50.0 (50.0 / -) |"
    )
    assert len(rows) == 2  # no run, no row


def test_the_chat_ends_at_the_first_step_that_finds_its_stop_file(tmp_path: Path) -> None:
    from helpers.kvchat import main

    model, out, stop = tmp_path / "model", tmp_path / "out", tmp_path / "stop"
    model.write_bytes(b"\x01" * (64 << 10))
    stop.write_text("x")
    # a minute of steps asked for; the stop file is there from the start: no step runs
    assert main(["--model", str(model), "--out", str(out), "--kv-start", "4", "--kv-end", "4",
                 "--duration", "60", "--stop", str(stop)]) == 0  # fmt: skip
    lines = out.read_text().splitlines()
    assert lines[0].startswith("ready ") and lines[1:] == ["done 0"], lines


def test_earlyoom_kills_are_its_sending_lines() -> None:
    log = (
        "earlyoom v1.7\nmem avail: 90 of 2000 MiB (4.50%), swap free: 0 of 0 MiB (0.00%)\n"
        'sending SIGTERM to process 123 uid 0 "qos-batch": badness 900, VmRSS 950 MiB\n'
        'sending SIGKILL to process 124 uid 0 "llama-completio": badness 800, VmRSS 90 MiB\n'
    )
    assert earlyoom_kills(log) == [
        "earlyoom SIGTERM: qos-batch",
        "earlyoom SIGKILL: llama-completio",
    ]
    assert earlyoom_kills("") == []
