"""Pure rule evaluation (governor/monitor/rules.py), conditions in the policy language, the
polled PSI fallback and the leak slope. Needs: nothing (no files, no clock)."""

from __future__ import annotations

import pytest

from governor.compile.compiler import watch_rule
from governor.monitor.leak import LeakDetector
from governor.monitor.psi import PolledTrigger, widen
from governor.monitor.rules import Observations, Rule, RuleEngine
from governor.plan.model import WatchCondition, WatchTrigger
from governor.policy import values as v
from governor.policy.durations import Duration


def _psi_rule(index: int, *, hold: float = 0, cooldown: float | None = None) -> Rule:
    trig = WatchTrigger(
        resource="memory",
        kind="some",
        stall_us=150_000,
        window_us=2_000_000,
        file="memory.pressure",
    )
    return Rule.from_watch(
        watch_rule(index=index, trigger=trig, hold_s=hold, cooldown_s=cooldown, actions=("log",))
    )


def _psi(*rules: int) -> Observations:
    return Observations(psi=frozenset(rules))


# ---------------------------------------------------------------- conditions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("leak > 500KB/s for 60s", v.LeakCondition(500 * 1024, Duration(60_000_000))),
        ("leak>1M/s for 2m", v.LeakCondition(1 << 20, Duration(120_000_000))),
        ("memavailable < 800M", v.MemAvailableCondition(800 << 20)),
        ("oom_kill", v.EventCondition("oom_kill")),
        ("memory some 150ms/2s", v.parse_trigger("memory some 150ms/2s")),
    ],
)
def test_conditions_parse_and_spell_back(text: str, expected: v.Condition) -> None:
    got = v.parse_condition(text)
    assert got == expected
    assert v.parse_condition(str(got)) == got


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("leak > 500KB/s", "form"),
        ("leak > 500KB/s for 2s", "too short"),
        ("leak > 0K/s for 60s", "positive"),
        ("memavailable < 50%", "not allowed"),
        ("memavailable > 800M", "form"),
        ("oom_kills", "cannot parse trigger"),
    ],
)
def test_bad_conditions_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        v.parse_condition(text)


def test_condition_rules_compile_to_watch_conditions() -> None:
    from governor.compile.compiler import _watch_trigger, when_text

    leak = _watch_trigger(v.parse_condition("leak > 500KB/s for 60s"))
    assert leak == WatchCondition(
        condition="leak", threshold=512000, window_s=60.0, file="memory.stat"
    )
    oom = _watch_trigger(v.parse_condition("oom_kill"))
    assert isinstance(oom, WatchCondition) and oom.event == "oom_kill"
    # the kernel's figure, and the board's: less the page cache memory.min protects
    raw = _watch_trigger(v.parse_condition("memavailable < 200M"))
    board = _watch_trigger(v.parse_condition("board available < 200M"))
    assert isinstance(raw, WatchCondition) and isinstance(board, WatchCondition)
    assert (raw.condition, board.condition) == ("memavailable", "available")
    assert board.threshold == raw.threshold == 200 << 20
    assert when_text(board) == "board available < 200MiB"
    assert when_text(raw) == "memavailable < 200MiB"


def test_a_headroom_rule_compiles_with_the_slices_peak_claim() -> None:
    """memory.max, else memory.high, is the claimed peak; neither: refused (65) naming the rule."""
    from governor.compile.compiler import when_text
    from governor.compile.headroom import headroom_condition as _headroom
    from governor.errors import PolicyError
    from governor.plan.model import CgroupWrite

    def w(file: str, value: str) -> CgroupWrite:
        return CgroupWrite(cgroup="g", file=file, value=value, reason=file, controller="memory")

    got = _headroom(2, [w("memory.high", "800"), w("memory.max", "1000")], "p.toml")
    assert (got.condition, got.threshold) == ("headroom", 1000)
    assert _headroom(2, [w("memory.high", "800"), w("memory.max", "max")], None).threshold == 800
    assert when_text(got) == "board available < headroom"
    with pytest.raises(PolicyError) as err:
        _headroom(2, [w("memory.min", "100")], "p.toml")
    assert err.value.exit_code == 65 and err.value.field == "pressure[2].when"


# ---------------------------------------------------------------- rule engine


def test_psi_rule_fires_on_every_trigger_event_without_cooldown() -> None:
    eng = RuleEngine([_psi_rule(0)])
    fired = [len(eng.step(t, _psi(0))) for t in (0.0, 2.0, 4.0)]
    assert fired == [1, 1, 1]


def test_for_needs_the_condition_to_hold_that_long() -> None:
    # the first trigger event covers the 2 s window before it: held 2 s at t=0, 4 s at t=2
    eng = RuleEngine([_psi_rule(0, hold=4)])
    assert eng.step(0.0, _psi(0)) == []
    assert eng.step(1.0, Observations()) == []
    (f,) = eng.step(2.0, _psi(0))
    assert f.active_s == 4.0


def test_for_restarts_after_a_gap_in_trigger_events() -> None:
    eng = RuleEngine([_psi_rule(0, hold=6)])
    eng.step(0.0, _psi(0))
    eng.step(2.0, _psi(0))
    eng.step(10.0, Observations())  # > 2.5 windows + 1 s without an event: episode over
    assert eng.step(11.0, _psi(0)) == []
    assert eng.step(13.0, _psi(0)) == []
    assert len(eng.step(15.0, _psi(0))) == 1


def test_cooldown_limits_firings_over_a_sustained_stall() -> None:
    eng = RuleEngine([_psi_rule(0, cooldown=5)])
    times = [t * 1.0 for t in range(0, 21, 2)]  # an event every 2 s for 20 s
    fired = [t for t in times if eng.step(t, _psi(0))]
    assert fired == [0.0, 6.0, 12.0, 18.0]


def test_rules_fire_in_policy_order_as_pressure_rises() -> None:
    eng = RuleEngine([_psi_rule(2, hold=6), _psi_rule(0), _psi_rule(1, hold=4)])
    order = []
    for t in (0.0, 2.0, 4.0):
        order += [(t, f.rule.index) for f in eng.step(t, _psi(0, 1, 2))]
    assert order == [(0.0, 0), (2.0, 0), (2.0, 1), (4.0, 0), (4.0, 1), (4.0, 2)]


def test_event_rule_fires_on_each_increase_and_reports_the_count() -> None:
    rule = Rule.from_watch(
        watch_rule(
            index=0,
            trigger=WatchCondition(condition="event", event="oom_kill", file="memory.events"),
            actions=("log",),
        )
    )
    eng = RuleEngine([rule])
    assert eng.step(0.0, Observations(counters={"high": 3})) == []
    (f,) = eng.step(1.0, Observations(counters={"oom_kill": 2}))
    assert f.value == 2


def test_level_rule_fires_once_per_episode_without_cooldown() -> None:
    rule = Rule.from_watch(
        watch_rule(
            index=0,
            trigger=WatchCondition(
                condition="memavailable", threshold=800 << 20, file="/proc/meminfo"
            ),
            actions=("log",),
        )
    )
    eng = RuleEngine([rule])
    lows = [900, 700, 600, 500, 900, 700]
    fired = [
        bool(eng.step(float(t), Observations(memavailable=m << 20))) for t, m in enumerate(lows)
    ]
    assert fired == [False, True, False, False, False, True]


def test_a_board_available_rule_reads_the_available_figure_not_memavailable() -> None:
    rule = Rule.from_watch(
        watch_rule(
            index=0,
            trigger=WatchCondition(
                condition="available", threshold=200 << 20, file="/proc/meminfo"
            ),
            actions=("log",),
        )
    )
    eng = RuleEngine([rule])
    assert not eng.step(0.0, Observations(memavailable=100 << 20, available=None))
    assert eng.step(1.0, Observations(memavailable=900 << 20, available=150 << 20))


def test_a_board_file_rule_holds_while_the_file_cache_is_below_the_model() -> None:
    model = 1100 << 20
    rule = Rule.from_watch(
        watch_rule(
            index=0,
            trigger=WatchCondition(condition="board_file", threshold=model, file="/proc/meminfo"),
            actions=("shed",),
            cooldown_s=2.0,
        )
    )
    eng = RuleEngine([rule])
    caches = [None, 1200, 900, 900, 900, 1000, 1100, 1200]  # MiB; None: unreadable
    fired = [
        bool(eng.step(float(t), Observations(board_file=None if m is None else m << 20)))
        for t, m in enumerate(caches)
    ]
    # below from t=2: fires, again after the cooldown while still below; the model's own size
    # is enough (not below)
    assert fired == [False, False, True, False, True, False, False, False]


def test_rule_actions_are_parsed_back_from_their_canonical_strings() -> None:
    trig = WatchTrigger(
        resource="memory",
        kind="full",
        stall_us=500_000,
        window_us=2_000_000,
        file="memory.pressure",
    )
    rule = Rule.from_watch(
        watch_rule(index=3, trigger=trig, actions=("set memory.high -10%", "freeze 2s", "kill"))
    )
    assert [a.verb for a in rule.actions] == ["set", "freeze", "kill"]
    assert rule.when == "memory full 500ms/2s"


# ---------------------------------------------------------------- PSI fallbacks


@pytest.mark.parametrize(
    ("stall", "window", "expected"),
    [
        (150_000, 1_000_000, (300_000, 2_000_000)),
        (50_000, 500_000, (200_000, 2_000_000)),
        (500_000, 3_000_000, (666_666, 4_000_000)),
        (150_000, 2_000_000, None),
        (1_000_000, 9_500_000, (1_052_631, 10_000_000)),
        (2_000_000, 10_000_000, None),
    ],
)
def test_unprivileged_windows_widen_to_2s_multiples_keeping_the_share(
    stall: int, window: int, expected: tuple[int, int] | None
) -> None:
    assert widen(stall, window) == expected


def test_polled_trigger_fires_when_the_stall_grows_within_a_window_at_most_once_per_window() -> (
    None
):
    p = PolledTrigger(stall_us=150_000, window_us=2_000_000)
    totals = [0, 10_000, 100_000, 300_000, 500_000, 700_000, 700_000, 700_000]
    fired = [p.update(float(t), total) for t, total in enumerate(totals)]
    assert fired == [False, False, False, True, False, True, False, False]


def test_leak_slope_needs_a_covered_window_then_measures_bytes_per_second() -> None:
    det = LeakDetector(window_s=10)
    for t in range(5):
        det.add(float(t), 1000 + 600 * t)
    assert det.slope() is None
    for t in range(5, 12):
        det.add(float(t), 1000 + 600 * t)
    assert det.slope() == pytest.approx(600.0)


def test_a_one_off_step_is_not_a_leak_but_steady_growth_is() -> None:
    step, steady = LeakDetector(window_s=12), LeakDetector(window_s=12)
    for t in range(13):
        # 300 MB allocated at once (a KV cache at context creation), flat before and after
        step.add(float(t), 100_000_000 + (300_000_000 if t >= 6 else 0))
        steady.add(float(t), 100_000_000 + 1_000_000 * t)
    slope = step.slope()
    assert slope is not None and slope < 1.0
    assert steady.slope() == pytest.approx(1_000_000.0)


def test_the_slowest_third_is_the_leak_rate() -> None:
    det = LeakDetector(window_s=9)
    rates = [1000] * 4 + [5000] * 3 + [1000] * 3  # faster in the middle third only
    v = 0
    for t, r in enumerate(rates):
        det.add(float(t), v)
        v += r
    slope = det.slope()
    assert slope is not None and 900 <= slope <= 1100


# ---------------------------------------------------------------- board available < headroom


def test_the_headroom_condition_parses_and_spells_back() -> None:
    got = v.parse_condition("board  available<headroom")
    assert got == v.HeadroomCondition()
    assert str(got) == "board available < headroom"
    with pytest.raises(ValueError, match="board available < headroom"):
        v.parse_condition("memavailable < headroom")


def _headroom_rule(peak: int) -> Rule:
    trig = WatchCondition(condition="headroom", threshold=peak, file="/proc/meminfo")
    return Rule.from_watch(watch_rule(index=0, trigger=trig, actions=("shed",)))


def test_a_headroom_rule_fires_when_the_board_spares_less_than_the_slice_still_needs() -> None:
    # claimed peak 1000 MiB, holding 600 MiB: it still needs 400 MiB
    eng = RuleEngine([_headroom_rule(1000 << 20)])

    def fires(t: float, spare_mib: int, current_mib: int = 600) -> bool:
        obs = Observations(spare=spare_mib << 20, current=current_mib << 20)
        return bool(eng.step(t, obs))

    assert not eng.step(0.0, Observations(spare=None, current=600 << 20))
    assert not fires(1.0, 450)
    assert fires(2.0, 399)  # fires before any stall: only the claim says it
    assert not fires(3.0, 300)  # a level rule: once per episode
    assert not fires(4.0, 300, current_mib=800)  # grown: it needs only 200 MiB more
    assert fires(5.0, 150, current_mib=800)  # a new episode
    # at its peak it needs nothing: only a board eating into the reserve is short
    assert not fires(6.0, 0, current_mib=1000)
    assert fires(7.0, -1, current_mib=1100)
