"""The restart budget (governor/monitor/restart.py), the polled PSI window
(governor/monitor/psi.py PolledTrigger) and the switch that forces it. Needs: nothing (no files,
no processes, no clock)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from governor.compile.compiler import compile_plan
from governor.errors import PolicyError
from governor.monitor.psi import PolledTrigger
from governor.monitor.restart import BACKOFF_CAP_S, Restarts, backoff_s
from governor.plan.host import probe
from governor.policy.loader import load_text

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"

# ---------------------------------------------------------------- backoff


def test_backoff_doubles_from_the_policy_value_and_stops_at_60s() -> None:
    assert [backoff_s(1.0, n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert [backoff_s(0.25, n) for n in range(1, 4)] == [0.25, 0.5, 1.0]
    assert backoff_s(90.0, 1) == BACKOFF_CAP_S  # a base above the cap is capped too
    assert backoff_s(1.0, 10_000) == BACKOFF_CAP_S  # no float overflow


def test_backoff_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="1 or more"):
        backoff_s(1.0, 0)


# ---------------------------------------------------------------- the budget


def test_restarts_are_granted_up_to_the_limit_then_refused_with_the_limit() -> None:
    r = Restarts(limit=2, base_s=1.0)
    for attempt, wait in ((1, 1.0), (2, 2.0)):
        assert r.refusal() is None
        req = r.request(rule=0, when="oom_kill")
        assert (req.attempt, req.backoff_s) == (attempt, wait)
        assert r.take() == req
        r.record(req, exit_code=137, sig=signal.SIGKILL)
    assert r.refusal() == "restart limit 2 reached"
    with pytest.raises(ValueError, match="restart limit 2 reached"):
        r.request(rule=0, when="oom_kill")
    assert [h["attempt"] for h in r.history] == [1, 2]
    assert r.history[0] == {
        "attempt": 1,
        "rule": 0,
        "when": "oom_kill",
        "backoff_s": 1.0,
        "exit_code": 137,
        "signal": 9,
        "signal_name": "SIGKILL",
    }


def test_restart_max_zero_refuses_the_first_restart() -> None:
    assert Restarts(limit=0, base_s=1.0).refusal() == "restart limit 0 reached"


def test_two_rules_asking_before_the_relaunch_make_one_restart() -> None:
    r = Restarts(limit=1, base_s=1.0)
    first = r.request(rule=0, when="oom_kill")
    assert r.refusal() is None  # the pending request is still good for the second rule
    assert r.request(rule=3, when="memory full 500ms/2s") is first
    assert r.take() is first and r.take() is None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_an_operator_stop_signal_cancels_a_pending_restart_and_refuses_new_ones(sig: int) -> None:
    r = Restarts(limit=3, base_s=1.0)
    r.request(rule=0, when="oom_kill")
    r.on_signal(sig)
    assert r.take() is None
    refused = r.refusal()
    assert refused is not None and signal.Signals(sig).name in refused


def test_usr1_is_a_message_for_the_engine_not_a_stop() -> None:
    r = Restarts(limit=3, base_s=1.0)
    req = r.request(rule=0, when="oom_kill")
    r.on_signal(signal.SIGUSR1)
    assert r.take() == req


def test_policy_restart_settings_reach_the_plan() -> None:
    host = probe(HOSTS / "cgroup2-full")
    text = 'name = "x"\n[process]\nrestart_max = 2\nrestart_backoff = "500ms"\n'
    launch = compile_plan(load_text(text, source="t.toml"), host).launch
    assert (launch.restart_max, launch.restart_backoff_s) == (2, 0.5)
    default = compile_plan(load_text('name = "x"\n', source="t.toml"), host).launch
    assert (default.restart_max, default.restart_backoff_s) == (3, 1.0)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("restart_max = -1", "process.restart_max"),
        ('restart_max = "2"', "process.restart_max"),
        ('restart_backoff = "0s"', "process.restart_backoff"),
        ("restart_backoff = 1", "process.restart_backoff"),
    ],
)
def test_bad_restart_settings_are_rejected_with_their_field(body: str, field: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_text(f'name = "x"\n[process]\n{body}\n', source="t.toml")
    assert field in str(info.value)


# ---------------------------------------------------------------- polled PSI window


def test_polled_window_interpolates_the_total_at_the_window_start() -> None:
    p = PolledTrigger(stall_us=150_000, window_us=2_000_000)
    assert p.stall_in_window(0.0, 0) is None  # one sample: no delta yet
    assert p.stall_in_window(1.0, 100_000) == 100_000  # window not covered: growth so far
    assert p.stall_in_window(2.0, 100_000) == 100_000
    # at 2.5 the window starts at 0.5, halfway between (0, 0) and (1, 100000): 50000 there
    assert p.stall_in_window(2.5, 100_000) == pytest.approx(50_000)
    # at 3.0 it starts at 1.0 exactly: nothing since
    assert p.stall_in_window(3.0, 100_000) == pytest.approx(0)


def test_a_sample_interval_longer_than_the_window_dilutes_the_stall() -> None:
    p = PolledTrigger(stall_us=300_000, window_us=500_000)
    p.update(0.0, 0)
    # 400 ms of stall over 1 s: at most 400 ms, at least 200 ms fell in any 500 ms of it
    assert p.stall_in_window(1.0, 400_000) == pytest.approx(200_000)
    assert not p.update(2.0, 800_000)  # 200 ms proven < 300 ms
    assert p.update(3.0, 1_600_000)  # 800 ms in 1 s: 400 ms proven in the window


def test_polled_trigger_fires_at_most_once_per_window_while_the_stall_lasts() -> None:
    p = PolledTrigger(stall_us=150_000, window_us=2_000_000)
    fired = [p.update(t * 0.5, int(t * 0.5 * 200_000)) for t in range(13)]  # 20% stall, 0.5 s
    times = [t * 0.5 for t, f in enumerate(fired) if f]
    assert times == [1.0, 3.0, 5.0]


def test_a_counter_that_goes_back_starts_the_window_over() -> None:
    p = PolledTrigger(stall_us=150_000, window_us=2_000_000)
    p.update(0.0, 5_000_000)
    assert p.stall_in_window(1.0, 10) is None  # a new cgroup under the same path
    assert p.stall_in_window(2.0, 200_010) == 200_000
