"""Admission's shed decision with routers (governor/board/unload.py, issue 46): a lower-class
router's idle models are unloaded under a lowered budget before anyone is stopped; what that
frees is the router's peak less the lowered budget (never below its memory.min); the stops
cover what the unloads leave; nothing covers: refused at once."""

from __future__ import annotations

import pytest

from governor.board.slice import QosClass, Slice
from governor.board.unload import Model, Room, plan
from governor.record import replace

MIB = 1 << 20
BG, STD = QosClass.BACKGROUND, QosClass.STANDARD


def s(name: str, cls: QosClass, peak: int, mn: int = 0) -> Slice:
    return Slice(
        name=name, cgroup=f"governor.slice/{name}", qos=cls, min=mn * MIB, peak=peak * MIB,
        peak_source="estimate", evicts=True,
    )  # fmt: skip


def room(r: Slice, own: int, busy: int, *idle: tuple[str, int, float | None]) -> Room:
    return Room(
        router=r, own=own * MIB, busy=busy * MIB,
        idle=tuple(Model(alias=a, size=n * MIB, last=last) for a, n, last in idle),
    )  # fmt: skip


R = s("r", BG, 1200)  # 100 own + 300 busy + idle m1 300 (colder) + m2 500
ROOM = room(R, 100, 300, ("m1", 300, 10.0), ("m2", 500, 50.0))
PLAIN = s("batch", BG, 300)

# (case, need (guarantee, peak) MiB, stoppable, rooms, unloads {router: models}, stops, enough)
CASES = [
    (
        "unload covers: the coldest idle model whose unload alone covers, nothing stopped",
        (0, 250), [R, PLAIN], [ROOM], {"r": ("m1",)}, [], True,
    ),
    (
        "a model that alone covers goes before a colder one that does not",
        (0, 450), [R, PLAIN], [ROOM], {"r": ("m2",)}, [], True,
    ),
    (
        "unloads need not cover alone: the largest first, then the rest",
        (0, 750), [R, PLAIN], [ROOM], {"r": ("m2", "m1")}, [], True,
    ),
    (
        "unload + stop: every idle model, then another slice stopped for the rest",
        (0, 900), [R, PLAIN], [ROOM], {"r": ("m2", "m1")}, ["batch"], True,
    ),
    (
        "the unloads and the others cannot cover, the router's own stop does: stops alone",
        (0, 1150), [R, PLAIN], [ROOM], {}, ["r"], True,
    ),
    (
        "a deficit of guarantees: an unload frees no memory.min, the stops decide",
        (100, 0), [R, s("held", BG, 300, mn=200)], [ROOM], {}, ["held"], True,
    ),
    (
        "guarantees and peaks missing: no unload, a stop that frees both",
        (100, 250), [R, s("held", BG, 300, mn=200)], [ROOM], {}, ["held"], True,
    ),
    (
        "nothing covers: refused, nothing unloaded",
        (0, 5000), [R, PLAIN], [ROOM], {}, ["r", "batch"], False,
    ),
    (
        "a router already lowered for another tenant offers no unload",
        (0, 250), [PLAIN], [replace(ROOM, router=replace(R, capped_by="tts"))], {}, ["batch"], True,
    ),
    (
        "the router's memory.min stays: a model whose unload frees nothing more stays loaded",
        (0, 500), [PLAIN], [room(s("r", BG, 1200, mn=900), 100, 300, ("m1", 300, 1.0), ("m2", 500, 2.0))],
        {"r": ("m2",)}, ["batch"], True,
    ),
    (
        "lowest class first: a background router's model before a standard one's colder one",
        (0, 250), [], [room(s("std", STD, 1000), 100, 0, ("old", 900, 1.0)), ROOM],
        {"r": ("m1",)}, [], True,
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_shed_plan(case: tuple[object, ...]) -> None:
    _, need, stoppable, rooms, unloads, stops, enough = case
    assert isinstance(need, tuple) and isinstance(stoppable, list) and isinstance(rooms, list)
    got = plan((need[0] * MIB, need[1] * MIB), stoppable, rooms)
    assert {u.router.name: u.models for u in got.unloads} == unloads
    assert [v.name for v in got.stops] == stops
    assert got.enough is enough


def test_the_lowered_budget_is_the_router_its_busy_models_and_the_idle_ones_it_keeps() -> None:
    got = plan((0, 250 * MIB), [R], [ROOM])
    (u,) = got.unloads
    assert u.models == ("m1",)
    assert (u.before, u.budget, u.own) == (1200 * MIB, 900 * MIB, 100 * MIB)
    assert u.frees == 300 * MIB  # 1200 - (100 + 300 + 500)


def test_a_peak_above_what_is_loaded_counts_once_a_model_is_unloaded() -> None:
    # the estimate counts models that are not loaded now: the lowered budget frees them too
    r = room(s("r", BG, 2000), 100, 0, ("m", 200, 1.0))
    assert r.frees(()) == 0 and r.frees(("m",)) == 1900 * MIB
