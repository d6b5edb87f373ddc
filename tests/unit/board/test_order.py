"""The one victim order (governor/board/order.py, issue 44 item 3) on tables of slices: lowest
class first; within a class the coldest slice that alone covers the deficit, else the
largest; a slice whose claim stays after a stop is never chosen."""

from __future__ import annotations

import pytest

from governor.board.order import order, pick, usage_frees
from governor.board.slice import QosClass, Slice

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
