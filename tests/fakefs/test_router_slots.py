"""Issue 46 item 3 on a fake cgroup tree: with the router's --slot-save-path, the evictor has
its victim's idle slots saved before the unload (supervise/evict.py's hook), and the victim's
next child, once the router lists it loaded, gets them back (supervise/slots.py in the model
leaves' router thread). The HTTP side: tests/unit/peer/test_router_slots.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from governor.plan.model import Plan
from governor.supervise.models import ModelLeaves, router_leaves
from governor.supervise.slots import SlotKeeper

from .test_model_leaves import MovingFs
from .test_router_evict import (
    GROUP,
    LEAF,
    ROUTER,
    A,
    B,
    C,
    FakeRouter,
    _child,
    _evict_tree,
    _leaves,
    _spawn,
)  # fmt: skip


@pytest.fixture
def tree(cgroup_root: Path, tmp_path: Path) -> tuple[MovingFs, Path]:
    """test_router_evict.py's tree: the router's group, its engine leaf, the router in it."""
    fs = MovingFs(cgroup_root)
    fs.enable("", ["memory", "cpu"])
    fs.mkdir("governor.slice")
    fs.enable("governor.slice", ["memory", "cpu"])
    fs.mkdir(GROUP)
    fs.mkdir(LEAF)
    proc = tmp_path / "proc"
    _spawn(fs, proc, 100, ROUTER)
    return fs, proc


class SlotRouter(FakeRouter):
    """FakeRouter with each model's slots and the slot actions (recorded in ``fs.writes``)."""

    def __init__(self, fs: MovingFs, pids: dict[str, int]) -> None:
        super().__init__(fs, pids)
        self.tasks = {a: 1 for a in pids}  # each running model served a task in slot 0
        self.restored: list[str] = []

    def slots(self, model: str) -> list[dict[str, Any]] | None:
        if model in self.unloaded:
            return None
        slot: dict[str, Any] = {"id": 0, "is_processing": False}
        if self.tasks.get(model):
            slot["id_task"] = self.tasks[model]
        return [slot]

    def slot_action(self, model: str, slot: int, action: str, filename: str) -> dict[str, Any]:
        self.fs.writes.append(("router", action, model))
        if action == "restore":
            self.restored.append(model)
        return {}

    def reload(self, model: str) -> None:
        self.unloaded.remove(model)
        self.tasks[model] = 0  # a new child: nothing served yet


def test_the_evicted_models_slots_are_saved_before_its_unload_and_restored_after_its_load(
    tree: tuple[MovingFs, Path],
) -> None:
    fs, proc = tree
    _evict_tree(fs, proc)  # 320 over 300: a (the least recently used) makes room for c
    router = SlotRouter(fs, {"a": A, "b": B, "c": C})
    keeper = SlotKeeper(router)  # type: ignore[arg-type]
    leaves, _ = _leaves(fs, proc, router, before_unload=keeper.save)
    leaves.slots = keeper
    leaves.poll()
    said = [w for w in fs.writes if w[0] == "router"]
    assert said == [("router", "save", "a"), ("router", "unload", "a")]  # saved, then unloaded
    assert keeper.saved == {"a": {0: keeper.saved["a"][0]}}
    assert keeper.restore() == {}  # a is not loading: nothing watched yet
    # a is asked for again: the router starts a new child, placed in a's leaf
    router.reload("a")
    _spawn(fs, proc, 104, _child("a"))
    leaves.place()
    assert keeper.pending.keys() == {"a"}
    assert keeper.restore() == {"a": [0]}
    assert router.restored == ["a"] and keeper.pending == {}


def test_a_router_launch_with_slot_save_path_wires_the_keeper(
    tree: tuple[MovingFs, Path], tmp_path: Path
) -> None:
    from .plans import make_plan

    fs, proc = tree
    plan: Plan = make_plan(group=GROUP, leaf=LEAF)
    plan = _evict_plan(plan)
    common: dict[str, Any] = dict(
        limits={}, router_url="http://127.0.0.1:9", claims={}, board=(tmp_path, tmp_path),
        journal=None, router_pid=lambda: 100, proc_root=proc, on_change=None,
    )  # fmt: skip
    leaves: ModelLeaves = router_leaves(fs, plan, slot_save=True, **common)
    assert leaves.slots is not None and leaves.evictor is not None
    assert leaves.evictor.before_unload == leaves.slots.save
    # a load answered dates the model's activity (peer/router.py FRESH_S)
    assert leaves.loads is not None and leaves.activity is not None
    assert leaves.loads.on_loaded == leaves.activity.touch
    bare = router_leaves(fs, plan, **common)
    assert bare.slots is None and bare.evictor is not None and bare.evictor.before_unload is None


def _evict_plan(plan: Plan) -> Plan:
    from governor.record import replace

    return replace(plan, engine=replace(plan.engine, evict="memory"))


def test_an_unloaded_models_empty_leaf_is_removed_and_made_again_at_its_next_load(
    tree: tuple[MovingFs, Path],
) -> None:
    """Issue 46 item 5: the evictor's victim left an empty leaf behind."""
    fs, proc = tree
    _evict_tree(fs, proc)  # a makes room for c
    router = FakeRouter(fs, {"a": A, "b": B, "c": C})
    leaves, _ = _leaves(fs, proc, router)
    leaves.poll()
    assert router.unloaded == ["a"]
    assert not fs.exists(f"{GROUP}/models/a")  # gone with its child
    assert fs.procs(f"{GROUP}/models/b") == [B]  # the others stay
    leaves.leaving.remove("b")  # a leaf with a process: the kernel refuses, it stays
    assert fs.procs(f"{GROUP}/models/b") == [B]
    router.unloaded.remove("a")
    _spawn(fs, proc, 104, _child("a"))
    leaves.place()
    assert fs.procs(f"{GROUP}/models/a") == [104]  # its next child: a new leaf


class _SlowExit(FakeRouter):
    """An unload whose child leaves cgroup.procs at once but populates its leaf until its
    memory is freed (the kernel's exit_mm before cgroup_exit): ``fs.tear_down`` ends it."""

    def exit(self, pid: int) -> None:
        self.fs.reap_slowly(pid)


def test_the_evictor_waits_for_its_victims_leaf_to_empty_not_its_procs_then_removes_it(
    tree: tuple[MovingFs, Path],
) -> None:
    """CI 2026-12-06: the evictor saw an empty cgroup.procs while its victim was still
    exiting, the rmdir then met EBUSY and the leaf stayed behind for good."""
    fs, proc = tree
    _evict_tree(fs, proc)
    router = _SlowExit(fs, {"a": A, "b": B, "c": C})
    leaves, ev = _leaves(fs, proc, router)
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        if len(slept) == 3:
            fs.tear_down()  # its address space freed: cgroup_exit

    ev.sleep = sleep
    leaves.poll()
    assert router.unloaded == ["a"]
    assert len(slept) == 3  # it waited while cgroup.procs was already empty
    assert not fs.exists(f"{GROUP}/models/a")  # then its leaf went at once
    assert leaves.unloads == {("a", "memory"): 1}


def test_a_leaf_still_populated_when_the_evictors_wait_ends_is_removed_at_a_later_round(
    tree: tuple[MovingFs, Path],
) -> None:
    fs, proc = tree
    _evict_tree(fs, proc)
    router = _SlowExit(fs, {"a": A, "b": B, "c": C})
    leaves, ev = _leaves(fs, proc, router)
    ev.wait_s = 0.0  # its child outlives the evictor's wait
    leaves.poll()
    assert router.unloaded == ["a"] and fs.exists(f"{GROUP}/models/a")
    assert fs.procs(f"{GROUP}/models/a") == [] and fs.events(f"{GROUP}/models/a")["populated"]
    leaves.tick()
    assert fs.exists(f"{GROUP}/models/a")  # still exiting: kept, tried again
    fs.tear_down()
    leaves.tick()
    assert not fs.exists(f"{GROUP}/models/a")
    assert fs.procs(f"{GROUP}/models/b") == [B]  # the others stay
    assert leaves.leaving.pending == {}


def test_another_policys_shed_unload_counts_in_the_victim_routers_unloads(
    tree: tuple[MovingFs, Path], tmp_path: Path
) -> None:
    """Issue 46 item 5: a shed's unload counted only in the shedder's governor_shed_total; the
    victim's launch follows its journal (the shedder writes there) and counts it, reason
    "shed"; entries of an older run (before its first look) are not its own."""
    from governor.rundir.journal import Journal
    from governor.supervise.activity import Activity
    from governor.supervise.models import SAMPLE_S

    fs, proc = tree
    journal = Journal(tmp_path / "run" / "r")
    journal.append("shed", [], by="old", pid=1, step="unload", model="a")  # an older run's
    now = [1000.0]
    leaves = ModelLeaves(
        fs, group=GROUP, leaf=LEAF, limits={}, router_pid=lambda: 100, proc_root=proc,
        activity=Activity(fs, GROUP), journal=journal, clock=lambda: now[0],
        on_change=lambda: None,
    )  # fmt: skip
    leaves.tick()
    assert leaves.unloads == {}
    journal.append("shed", [], by="chat", pid=1, step="unload", model="b")
    journal.append("shed", [], by="chat", pid=1, step="throttle")  # no unload
    journal.append("unload", [], model="b", reason="room for c")  # the evictor's own
    now[0] += SAMPLE_S
    leaves.tick()
    assert leaves.published()["unloads"] == [{"model": "b", "reason": "shed", "count": 1}]
    now[0] += SAMPLE_S
    leaves.tick()  # nothing new: counted once
    assert leaves.unloads == {("b", "shed"): 1}
