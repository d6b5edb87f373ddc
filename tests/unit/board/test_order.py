"""The one victim order (governor/board/order.py, issue 44 item 3) on tables of slices: lowest
class first; within a class the coldest slice that alone covers the deficit, else the
largest; a slice whose claim stays after a stop is never chosen."""

from __future__ import annotations

import pytest

from governor.board.order import (
    REUSE_HALF_LIFE_S,
    by_value,
    expected_cost,
    order,
    pick,
    usage_frees,
)
from governor.board.slice import QosClass, Slice
from governor.record import replace

MIB = 1 << 20
BG, STD = QosClass.BACKGROUND, QosClass.STANDARD


def s(name: str, cls: QosClass, peak_mib: int, active: float | None, stays: str = "") -> Slice:
    return Slice(
        name=name, cgroup=f"governor.slice/{name}", qos=cls, peak=peak_mib * MIB,
        peak_source="max", active_at=active, stays=stays, current=peak_mib * MIB,
    )  # fmt: skip


# (case, slices, deficit in MiB (guarantees, peaks), the victims picked, enough)
CASES = [
    (
        "lowest class first, even when a higher one is colder and larger",
        [s("std-old", STD, 900, 10.0), s("bg-new", BG, 300, 500.0)],
        (0, 200),
        ["bg-new"],
        True,
    ),
    (
        "within a class the coldest that alone covers, not the largest",
        [s("big-cold", BG, 900, 50.0), s("mid-coldest", BG, 400, 10.0), s("hot", BG, 500, 90.0)],
        (0, 300),
        ["mid-coldest"],
        True,
    ),
    (
        "a colder one that does not cover alone is passed over for one that does",
        [s("tiny-coldest", BG, 100, 1.0), s("covers", BG, 400, 60.0), s("hot", BG, 800, 99.0)],
        (0, 300),
        ["covers"],
        True,
    ),
    (
        "none covers alone: the largest first, then the coldest that covers the rest",
        [s("a", BG, 200, 5.0), s("b", BG, 250, 80.0), s("c", BG, 150, 1.0)],
        (0, 400),
        ["b", "c"],
        True,
    ),
    (
        "a slice whose claim stays is never chosen, even the only cover",
        [s("kept", BG, 900, 1.0, stays="apply"), s("small", BG, 100, 50.0)],
        (0, 300),
        ["small"],
        False,
    ),
    (
        "no activity known counts as coldest",
        [s("seen", BG, 500, 10.0), s("never", BG, 500, None)],
        (0, 300),
        ["never"],
        True,
    ),
    (
        "a guarantee deficit: the slice must free enough memory.min too",
        [
            Slice(name="peaky", cgroup="g/peaky", qos=BG, min=0, peak=900 * MIB, active_at=1.0),
            Slice(
                name="guard",
                cgroup="g/guard",
                qos=BG,
                min=400 * MIB,
                peak=400 * MIB,
                active_at=90.0,
            ),
        ],
        (300, 0),
        ["guard"],
        True,
    ),
]


@pytest.mark.parametrize(
    ("slices", "need", "victims", "enough"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_pick_follows_the_one_victim_order(
    slices: list[Slice], need: tuple[int, int], victims: list[str], enough: bool
) -> None:
    got, ok = pick(slices, (need[0] * MIB, need[1] * MIB))
    assert [v.name for v in got] == victims
    assert ok is enough


def test_without_a_deficit_each_class_goes_largest_first_and_stays_only_bars_a_stop() -> None:
    table = [
        s("std", STD, 900, 1.0),
        s("bg-small", BG, 100, 1.0),
        s("bg-big", BG, 700, 99.0),
        s("kept", BG, 300, 5.0, stays="governor monitor"),
    ]
    ladder = order(table, None, frees=usage_frees, stop=False)
    assert [v.name for v in ladder] == ["bg-big", "kept", "bg-small", "std"]
    stops = order(table, None, frees=usage_frees)
    assert "kept" not in [v.name for v in stops]


# issue 46 item 2: the same figure for a router's idle models (by_value) and across slices
# (name, MiB it frees, reload seconds (None: not measured), seconds since its last request)
Model = tuple[str, int, float | None, float | None]
NOW = 1_700_000_000.0

VALUE_CASES: list[tuple[str, list[Model], int, list[str]]] = [
    (
        "the cheapest to bring back that covers, not the least recently used",
        [("lru-slow", 400, 30.0, 600.0), ("recent-fast", 300, 2.0, 10.0)],
        200,
        ["recent-fast", "lru-slow"],
    ),
    (
        "a cheaper cover within a load's noise (not under a third) does not overturn recency",
        [("cold", 300, 5.0, 600.0), ("recent", 300, 1.5, 10.0)],
        100,
        ["cold", "recent"],
    ),
    (
        "a long-idle slow model costs less than a hot fast one",
        [("idle-slow", 400, 30.0, 36000.0), ("hot-fast", 300, 2.0, 1.0)],
        200,
        ["idle-slow", "hot-fast"],
    ),
    (
        "a cheap one that does not cover alone waits for the one that does",
        [("cheap-small", 100, 1.0, 5.0), ("dear-big", 500, 40.0, 5.0)],
        300,
        ["dear-big", "cheap-small"],
    ),
    (
        "none covers alone: the largest first, then the cheapest that covers the rest",
        [("a", 200, 5.0, 1.0), ("b", 250, 50.0, 1.0), ("c", 150, 9.0, 1.0), ("d", 160, 1.0, 1.0)],
        400,
        ["b", "d", "a", "c"],
    ),
    (
        "nothing measured: the least recently used that covers (never requested: coldest)",
        [("old", 300, None, 900.0), ("new", 300, None, 9.0), ("never", 300, None, None)],
        100,
        ["never", "old", "new"],
    ),
]


@pytest.mark.parametrize(
    ("models", "need_mib", "expected"),
    [c[1:] for c in VALUE_CASES],
    ids=[c[0] for c in VALUE_CASES],
)
def test_by_value_orders_idle_models_by_expected_reload_cost(
    models: list[Model], need_mib: int, expected: list[str]
) -> None:
    table = {m[0]: m for m in models}

    def cost(a: str) -> tuple[float | None, float | None]:
        idle = table[a][3]
        return table[a][2], None if idle is None else NOW - idle

    got = by_value(
        list(table), need_mib * MIB, now=NOW, frees=lambda a: table[a][1] * MIB, cost=cost
    )
    assert got == expected


def test_expected_cost_is_reload_seconds_times_a_reuse_likelihood_halving_with_idleness() -> None:
    assert expected_cost(10.0, NOW, NOW) == 10.0
    assert expected_cost(10.0, NOW - REUSE_HALF_LIFE_S, NOW) == pytest.approx(5.0)
    assert expected_cost(None, NOW - 2 * REUSE_HALF_LIFE_S, NOW) == pytest.approx(0.25)
    assert expected_cost(10.0, None, NOW) == 0.0  # never asked for


def test_the_slices_order_weighs_measured_reload_seconds_the_same_way() -> None:
    """Two background routers both cover; the colder one took 60 s to load its models, the
    warmer one 3 s: the warmer one is stopped (coldest-first stopped the colder)."""
    slow = replace(s("slow-cold", BG, 500, NOW - 300), reload_s=60.0)
    fast = replace(s("fast-warm", BG, 500, NOW - 60), reload_s=3.0)
    got, ok = pick([slow, fast], (0, 300 * MIB), now=NOW)
    assert [v.name for v in got] == ["fast-warm"] and ok
    unmeasured = [replace(slow, reload_s=None), replace(fast, reload_s=None)]
    assert [v.name for v in pick(unmeasured, (0, 300 * MIB), now=NOW)[0]] == ["slow-cold"]
