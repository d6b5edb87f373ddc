"""perf/router.py's pure parts (perf/router_common.py): the arms, the request mix and the table
with its ratios to the governor's arm (the benchmark itself runs in the kernel guest, not in
CI)."""

from __future__ import annotations

import itertools

import pytest

from governor.board.order import by_value
from perf.governor_lru import lru
from perf.router_common import (
    ARMS,
    MIB,
    VARIANTS,
    Arm,
    Result,
    mix,
    parse_arms,
    ratio,
    table,
    value_table,
)


def test_the_arms_are_three_per_variant_and_arms_3_and_4_are_governed() -> None:
    names = [a.name for a in ARMS]
    assert names == ["1a", "2a", "3a", "1b", "2b", "3b", "1c", "3c", "4c"]
    assert [(a.models_max, a.governed) for a in ARMS[:3]] == [(2, False), (3, False), (3, True)]
    assert [(a.models_max, a.governed) for a in ARMS[6:]] == [(2, False), (3, True), (3, True)]
    assert "LRU order" in Arm(4, "c").describe() and "LRU" not in Arm(3, "c").describe()
    assert parse_arms("3b,1a,4c") == [Arm(3, "b"), Arm(1, "a"), Arm(4, "c")]
    with pytest.raises(ValueError, match="unknown arm '4a'"):
        parse_arms("1a,4a")


def test_variant_c_mixes_a_slow_model_with_two_quick_ones_in_a_b_c_order() -> None:
    c = VARIANTS["c"]
    assert c.mixed and not VARIANTS["a"].mixed and not VARIANTS["b"].mixed
    assert mix(7, c.pattern) == list("abcabca")  # c needs room while a is the LRU idle model
    assert mix(4) == list("abca")  # the other variants' order unchanged


def test_the_mix_never_asks_the_same_model_twice_in_a_row_and_asks_each_alike() -> None:
    got = mix(12)
    assert got[:9] == list("abcabcacb")  # the brief's A B C A B C A C B
    assert all(x != y for x, y in itertools.pairwise(mix(40)))
    assert {m: got.count(m) for m in "abc"} == {"a": 4, "b": 4, "c": 4}
    assert mix(0) == []


def test_the_variants_memory_max_differ_and_b_grows_the_context() -> None:
    assert VARIANTS["a"].memory_max == "628M"  # the measurement
    assert "8192" in VARIANTS["b"].flags and "512" in VARIANTS["a"].flags


def test_ratio_is_a_dash_without_a_base() -> None:
    assert ratio(3.0, 2.0) == "1.50x"
    assert ratio(3.0, 0.0) == "-"
    assert ratio(None, 2.0) == "-"
    assert ratio(1.0, None) == "-"


def _result(arm: str, **kw: object) -> Result:
    r = Result(parse_arms(arm)[0])
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_the_table_has_a_row_per_arm_and_ratios_to_arm_3_of_the_same_variant() -> None:
    results = [
        _result("1a", latencies=[1.0, 2.0, 9.0], peak=600 * MIB, peak_source="memory.peak",
                refault_file=256 * 100),  # 100 MiB in 4 KiB pages
        _result("2b", latencies=[4.0], failed=3, oom_kills=3, kernel_kills=3,
                peak=1400 * MIB, peak_source="sampled memory.current"),
        _result("3a", latencies=[1.0, 1.0, 3.0], peak=500 * MIB, peak_source="memory.peak",
                refault_file=256 * 50, unloads=4),
        _result("3b", latencies=[2.0, 2.0], peak=1000 * MIB, peak_source="memory.peak"),
    ]  # fmt: skip
    text = table(results)
    rows = text.splitlines()
    assert rows[2] == ("| 1a: router alone, --models-max 2 | 0 of 3 | 0 (0) | 600 | 100 | 2.0 |"
                       " 9.0 | - | 0 |")  # fmt: skip
    assert rows[3].startswith("| 2b: router alone, --models-max 3 | 3 of 4 | 3 (3) |"
                              " 1400 (sampled memory.current) | 0 |")  # fmt: skip
    assert rows[4].endswith("| 4 | 0 |")  # the governor's unloads
    # 1a against 3a (not 3b): peak 600/500, re-read 100/50, median 2/1, max 9/3
    assert "| 1a / 3a | 1.20x | 2.00x | 2.00x | 3.00x |" in rows
    # 2b against 3b: 3b re-read nothing, so no ratio for it
    assert "| 2b / 3b | 1.40x | - | 2.00x | 2.00x |" in rows


def test_the_table_without_a_governed_arm_has_no_ratios() -> None:
    text = table([_result("1a", latencies=[1.0]), _result("2a")])
    assert "arm / arm 3" not in text
    assert "| 2a: router alone, --models-max 3 | 0 of 0 | 0 (0) | - | 0 | - | - | - | 0 |" in text


def test_the_table_ratios_are_to_arm_3_not_to_the_lru_arm() -> None:
    results = [_result("1c", latencies=[2.0]), _result("3c", latencies=[1.0]),
               _result("4c", latencies=[4.0])]  # fmt: skip
    assert "| 1c / 3c | - | - | 2.00x | 2.00x |" in table(results).splitlines()


def test_the_value_table_counts_loads_per_model_and_splits_reloaded_turns_by_restore() -> None:
    gov = _result(
        "3c", latencies=[1.0] * 6, unloads=3, refault_file=256 * 10,
        loads=[("a", 30.0), ("b", 2.0), ("c", 2.5), ("b", 2.0)],
        reloaded_turns=[(0.5, 4, True), (0.7, 4, True), (3.0, 33, False)],
    )  # fmt: skip
    alone = _result("1c", latencies=[1.0] * 5, failed=1, loads=[("a", 31.0), ("a", 29.0)],
                    reloaded_turns=[(9.0, 29, False)])  # fmt: skip
    rows = value_table([alone, gov]).splitlines()
    assert rows[2] == ("| 1c: router alone, --models-max 2 | 1 of 6 | 0 (0) | 0 | 2 / 0 / 0 |"
                       " 60.0 | - | - | 9.0 (29 tok) x1 | 0 |")  # fmt: skip
    assert rows[3] == ("| 3c: governor, evict = memory, --models-max 3 | 0 of 6 | 0 (0) | 10 |"
                       " 1 / 2 / 1 | 36.5 | 3 | 0.6 (4 tok) x2 | 3.0 (33 tok) x1 | 0 |")  # fmt: skip


# the bench switch of arm 4 (perf/governor_lru.py) against the evictor's order by value: idle
# models least recently used first, (load seconds, last request), what each frees; c needs
# 40 bytes
IDLE = ["a", "b"]
FREES = {"a": 273, "b": 50}
COSTS: dict[str, tuple[float | None, float | None]] = {"a": (30.0, 1000.0), "b": (2.0, 1010.0)}


def test_the_lru_switch_keeps_the_least_recently_used_first_where_value_would_not() -> None:
    value = by_value(IDLE, 40, frees=FREES.__getitem__, cost=COSTS.__getitem__, now=1020.0)
    assert value[0] == "b"  # by value: the quick one gives way, the slow one stays
    assert lru(object(), list(IDLE), 40) == ["a", "b"]  # type: ignore[arg-type]
