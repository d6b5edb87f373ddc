"""perf/router.py's pure parts (perf/router_common.py): the arms, the request mix and the table
with its ratios to the governor's arm (the benchmark itself runs in the kernel guest, not in
CI)."""

from __future__ import annotations

import itertools

import pytest

from perf.router_common import ARMS, MIB, VARIANTS, Arm, Result, mix, parse_arms, ratio, table


def test_the_arms_are_three_per_variant_and_only_arm_3_is_governed() -> None:
    assert [a.name for a in ARMS] == ["1a", "2a", "3a", "1b", "2b", "3b"]
    assert [(a.models_max, a.governed) for a in ARMS[:3]] == [(2, False), (3, False), (3, True)]
    assert parse_arms("3b,1a") == [Arm(3, "b"), Arm(1, "a")]
    with pytest.raises(ValueError, match="unknown arm '4a'"):
        parse_arms("1a,4a")


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
