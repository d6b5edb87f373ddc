"""Admission's shed with a lower-class router (issue 46): governor/board/admission.py's loop with
fixture claims, a fake clock, a fake stop and a fake unloader (board/unloading.py's doors): the
unloads go first and nothing is stopped when they cover; a failed unload gives every lowered
budget back and refuses (75) before anyone is stopped; a refusal after the unloads gives them
back too. The real router: tests/kernel/test_router_unload_guest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.api.admit import admission
from governor.board.admission import Unloader
from governor.board.budget import MIB, slice_of_plan
from governor.board.slice import Slice
from governor.board.unload import Model, Room, Unload
from governor.errors import AdmissionRefused, GovernorError
from governor.operate.boardview import fits
from governor.record import replace

from .test_admission import FakeBoard, other, plan


def router(peak: int) -> Slice:
    return replace(
        other("r", "background", 0, peak), state="running", evicts=True, router_url="http://x:1"
    )


class FakeUnloader:
    """The unloads the admission asked for, what it gave back; the board claim they lower."""

    def __init__(self, board: FakeBoard, *, fail: str | None = None) -> None:
        self.board = board
        self.fail = fail
        self.done: list[tuple[str, tuple[str, ...]]] = []
        self.restored: list[str] = []
        self.deadlines: list[float] = []

    def rooms(self, routers: list[Slice]) -> list[Room]:
        return [
            Room(router=r, own=100 * MIB, busy=200 * MIB,
                 idle=(Model("m1", 300 * MIB, last=1.0), Model("m2", 400 * MIB, last=2.0)))
            for r in routers
        ]  # fmt: skip

    def unload(self, u: Unload, deadline: float) -> None:
        self.deadlines.append(deadline)
        if self.fail is not None and self.fail in (*u.models, u.router.name):
            raise GovernorError(f"router {u.router.name} did not unload {self.fail}")
        self.done.append((u.router.name, u.models))
        self.board.claims = [
            replace(c, peak=u.budget) if c.name == u.router.name else c for c in self.board.claims
        ]

    def restore(self, u: Unload) -> None:
        self.restored.append(u.router.name)

    def doors(self) -> Unloader:
        return Unloader(
            rooms=self.rooms, unload=self.unload, restore=self.restore,
            text=lambda u: f"unloaded {', '.join(u.models)} from router {u.router.name}",
        )  # fmt: skip


def test_an_unload_that_covers_stops_nobody_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # budget 1792 MiB; chat's peak 1 GiB beside r's 1 GiB: 256 MiB short; m1 (300 MiB, the
    # colder) and m2 cover alone: m1 goes, r's budget 100 + 200 busy + m2's 400 = 700 MiB
    b = FakeBoard(router(1024 * MIB))
    u = FakeUnloader(b)
    got = admission(plan("shed"), unloader=u.doors(), **b.kw(tmp_path))
    got.release()
    assert u.done == [("r", ("m1",))] and b.stopped == [] and u.restored == []
    assert u.deadlines == [5.0]  # the admission's: started (0) + admit_timeout (5 s)
    assert got.note == "admitted after unloading m1 from r (a lower class)"
    assert "governor: admission of chat unloaded m1 from router r\n" in capsys.readouterr().err


def test_unloads_then_a_stop_for_what_they_leave(tmp_path: Path) -> None:
    b = FakeBoard(router(1200 * MIB), other("batch", "background", 0, 500 * MIB))
    u = FakeUnloader(b)
    # 1024 + 1700 - 1792: 932 MiB short; every idle model frees 900, batch the rest
    admission(plan("shed"), unloader=u.doors(), **b.kw(tmp_path)).release()
    assert u.done == [("r", ("m2", "m1"))] and b.stopped == ["batch"]


def test_check_and_board_fits_say_the_unloads_and_the_stop_before_the_start(
    tmp_path: Path,
) -> None:
    b = FakeBoard(router(1200 * MIB), other("batch", "background", 0, 500 * MIB))
    u = FakeUnloader(b)
    would = (
        "unload m2, m1 from router r (frees 900 MiB: r's budget 1200 MiB -> 300 MiB) and stop batch"
    )
    lines: list[str] = []
    admission(plan("shed"), unloader=u.doors(), act=False, hold=False, say=lines.append,
              **b.kw(tmp_path)).release()  # fmt: skip
    assert len(lines) == 1 and lines[0].endswith(f"; the shed would {would}")
    assert u.done == [] and b.stopped == []  # said, not done
    seen = b.gather()
    out = fits(seen.budget, slice_of_plan(plan("shed")), seen.slices, "shed", u.rooms)
    assert out["line"].endswith(f'; admit = "shed" would {would}')
    assert out["victims"] == ["batch"] and [x["models"] for x in out["unloads"]] == [["m2", "m1"]]
    # no router to unload: the line as before this (the victims a stop frees)
    alone = fits(seen.budget, slice_of_plan(plan("shed")), seen.slices, "shed", None)
    assert alone["unloads"] == [] and alone["line"].endswith('; admit = "shed" would stop r')


def test_a_failed_unload_gives_every_budget_back_and_refuses_before_any_stop(
    tmp_path: Path,
) -> None:
    b = FakeBoard(router(1200 * MIB), other("batch", "background", 0, 500 * MIB))
    u = FakeUnloader(b, fail="m2")
    with pytest.raises(AdmissionRefused) as err:
        admission(plan("shed"), unloader=u.doors(), **b.kw(tmp_path))
    assert err.value.exit_code == 75 and b.stopped == [] and u.done == []
    assert str(err.value).endswith(
        "short (r claims 1200 MiB; batch claims 500 MiB), and router r did not unload m2"
        f" ([qos] admit, {_board()})"
    )


class Stays(FakeUnloader):
    def unload(self, u: Unload, deadline: float) -> None:  # done, but the claim stays
        self.done.append((u.router.name, u.models))


def test_a_failed_unload_gives_the_routers_unloaded_before_it_their_budget_back(
    tmp_path: Path,
) -> None:
    # two routers of 1 GiB: 1280 MiB short, each frees at most 724 MiB: both unload
    b = FakeBoard(router(1024 * MIB), replace(router(1024 * MIB), name="r2"))
    u = FakeUnloader(b, fail="r2")
    with pytest.raises(AdmissionRefused, match="and router r2 did not unload"):
        admission(plan("shed"), unloader=u.doors(), **b.kw(tmp_path))
    assert [name for name, _ in u.done] == ["r"] and u.restored == ["r"] and b.stopped == []


def test_a_refusal_after_the_unloads_gives_the_budgets_back(tmp_path: Path) -> None:
    b = FakeBoard(router(1024 * MIB))
    u = Stays(b)
    with pytest.raises(AdmissionRefused, match="after 5s of shed"):
        admission(plan("shed"), unloader=u.doors(), **b.kw(tmp_path))
    assert u.done == [("r", ("m1",))] and u.restored == ["r"]


def test_nothing_covers_refuses_at_once_and_unloads_nothing(tmp_path: Path) -> None:
    b = FakeBoard(router(1024 * MIB), other("peer", "interactive", 0, 1500 * MIB))
    u = FakeUnloader(b)
    with pytest.raises(AdmissionRefused, match="no lower class to shed frees enough"):
        admission(plan("shed"), unloader=u.doors(), **b.kw(tmp_path))
    assert u.done == [] and b.stopped == [] and b.now == 0


def test_a_router_that_cannot_hold_a_budget_is_stopped_as_before(tmp_path: Path) -> None:
    b = FakeBoard(replace(router(1024 * MIB), evicts=False))
    u = FakeUnloader(b)
    got = admission(plan("shed"), unloader=u.doors(), **b.kw(tmp_path))
    got.release()
    assert u.done == [] and b.stopped == ["r"]
    assert got.note == "admitted after stopping r (a lower class)"


def _board() -> str:
    from governor.board.file import board_path

    return str(board_path())
