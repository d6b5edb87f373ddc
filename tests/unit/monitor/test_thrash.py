"""The thrash condition: ``refaults > P%/W`` parsed, compiled, measured (monitor/thrash.py) and
evaluated as a level rule (monitor/rules.py). Needs: nothing."""

from __future__ import annotations

from decimal import Decimal

import pytest

from governor.compile.compiler import _watch_trigger, watch_rule, when_text
from governor.monitor.rules import Observations, Rule, RuleEngine
from governor.monitor.thrash import (
    RefaultMeter,
    Thrash,
    board_file_bytes,
    refault_pages,
    refault_share,
)
from governor.plan.model import WatchCondition
from governor.policy import values as v
from governor.policy.durations import Duration
from governor.policy.refaults import RefaultCondition

PAGE = 4096


@pytest.mark.parametrize(
    ("text", "percent", "window_us", "board"),
    [
        ("refaults > 50%/10s", "50", 10_000_000, False),
        ("board refaults > 12.5%/4s", "12.5", 4_000_000, True),
        ("refaults>200%/1m", "200", 60_000_000, False),
    ],
)
def test_refault_conditions_parse_and_spell_back(
    text: str, percent: str, window_us: int, board: bool
) -> None:
    c = v.parse_condition(text)
    assert c == RefaultCondition(Decimal(percent), Duration(window_us), board=board)
    assert v.parse_condition(str(c)) == c


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("refaults > 50/10s", "cannot parse"),
        ("refaults > 0%/10s", "positive"),
        ("refaults > 0.005%/10s", r"0\.005% is below the smallest the plan holds, 0\.01%"),
        ("board refaults > 0.0099%/10s", "below the smallest"),
        ("refaults > 50%/1s", "too short"),
        ("board refaults < 50%/10s", "cannot parse"),
    ],
)
def test_bad_refault_conditions_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        v.parse_condition(text)


def test_the_smallest_refault_share_compiles_to_one_hundredth_of_a_percent() -> None:
    smallest = _watch_trigger(v.parse_condition("refaults > 0.01%/10s"))
    assert isinstance(smallest, WatchCondition) and smallest.threshold == 1
    assert when_text(smallest) == "refaults > 0.01%/10s"


def test_refault_rules_compile_to_a_share_in_hundredths_of_a_percent() -> None:
    group = _watch_trigger(v.parse_condition("refaults > 12.5%/10s"))
    assert group == WatchCondition(
        condition="refaults", file="memory.stat", threshold=1250, window_s=10.0
    )
    board = _watch_trigger(v.parse_condition("board refaults > 50%/4s"))
    assert isinstance(board, WatchCondition) and board.condition == "board_refaults"
    assert board.file == "/proc/vmstat" and board.threshold == 5000
    assert when_text(group) == "refaults > 12.5%/10s"
    assert when_text(board) == "board refaults > 50%/4s"


def test_the_share_is_refaulted_bytes_over_the_file_cache() -> None:
    # 25600 pages of 4 KiB = 100 MiB re-read, over a 200 MiB cache: 50 %
    assert refault_share(25600, PAGE, 200 << 20) == pytest.approx(50.0)
    assert refault_share(10, PAGE, 0) is None


def test_counters_come_from_memory_stat_or_vmstat_and_the_file_lrus() -> None:
    assert refault_pages({"workingset_refault_anon": 7, "workingset_refault_file": 3}) == 3
    assert refault_pages({"workingset_refault": 9}) == 9  # before 5.9
    assert refault_pages({}) is None
    mi = {"Active(file)": 1666744 * 1024, "Inactive(file)": 3713612 * 1024}
    assert board_file_bytes(mi) == (1666744 + 3713612) * 1024
    assert board_file_bytes({"MemTotal": 1}) is None


def test_the_meter_answers_once_the_window_is_covered_and_spans_it() -> None:
    m = RefaultMeter(10.0, PAGE)
    file = 100 << 20
    assert m.add(0.0, 1000, file) is None
    for t in range(1, 9):
        assert m.add(float(t), 1000 + 1280 * t, file) is None  # 5 MiB/s re-read
    # at t=9 the oldest sample is 9 s old (90 % of the window): 9 x 5 MiB over 100 MiB
    assert m.add(9.0, 1000 + 1280 * 9, file) == pytest.approx(45.0)
    # later, only the last 10 s count: the first samples are dropped
    for t in range(10, 20):
        m.add(float(t), 1000 + 1280 * t, file)
    assert m.add(20.0, 1000 + 1280 * 20, file) == pytest.approx(50.0)
    # a late sample: the base is the last one at or before the window's start (11 s here)
    assert m.add(31.0, 1000 + 1280 * 31, file) == pytest.approx(55.0)
    assert m.last == pytest.approx(55.0)


def test_a_counter_that_goes_back_restarts_the_window() -> None:
    m = RefaultMeter(2.0, PAGE)
    m.add(0.0, 5000, 1 << 20)
    m.add(2.0, 5100, 1 << 20)
    assert m.add(3.0, 10, 1 << 20) is None  # a new group by the same path: no negative share


def test_thrash_feeds_group_rules_from_the_sample_and_board_rules_from_proc() -> None:
    board = {"read": (0, 100 << 20)}
    t = Thrash([(0, "refaults", 2.0), (1, "board_refaults", 2.0)], PAGE, lambda: board["read"])
    assert t.sample(0.0, 0, 100 << 20) == {}
    board["read"] = (2560, 100 << 20)  # the board re-read 10 MiB
    got = t.sample(2.0, 25600, 100 << 20)  # the group re-read 100 MiB
    assert got == {0: pytest.approx(100.0), 1: pytest.approx(10.0)}
    assert t.now_pct(0) == 100.0 and t.now_pct(7) is None


def _rule(text: str, index: int = 0, cooldown: float | None = None) -> Rule:
    trigger = _watch_trigger(v.parse_condition(text))
    return Rule.from_watch(watch_rule(index, trigger, ("log",), when=text, cooldown_s=cooldown))


def test_a_refault_rule_fires_above_its_share_once_per_episode() -> None:
    rule = _rule("refaults > 50%/10s")
    assert rule.kind == "refaults" and rule.threshold == 5000 and rule.window_s == 10.0
    eng = RuleEngine([rule])
    assert eng.step(1.0, Observations(refaults={0: 49.9})) == []
    fired = eng.step(2.0, Observations(refaults={0: 63.04}))
    assert [f.value for f in fired] == [63.0]
    assert eng.step(3.0, Observations(refaults={0: 80.0})) == []  # same episode
    assert eng.step(4.0, Observations(refaults={0: 10.0})) == []  # ends it
    assert len(eng.step(5.0, Observations(refaults={0: 51.0}))) == 1


def test_a_board_refault_rule_reads_its_own_index() -> None:
    rule = _rule("board refaults > 5%/4s", index=3)
    assert rule.kind == "board_refaults"
    eng = RuleEngine([rule])
    assert eng.step(1.0, Observations(refaults={0: 90.0})) == []
    assert len(eng.step(2.0, Observations(refaults={3: 6.0}))) == 1


def test_a_refault_rule_may_shed() -> None:
    w = watch_rule(0, _watch_trigger(v.parse_condition("refaults > 30%/10s")), ("shed",))
    assert [a.verb for a in w.actions] == ["shed"]
