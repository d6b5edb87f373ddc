"""Issue 46 items 1, 2 and 4 on a fake cgroup tree: the evictor unloads the idle model that
covers what is missing at the least expected cost (measured reload seconds x likelihood of
reuse), never loops on a model that cannot fit, and each child's load is timed from its
placement to the router's first "loaded" and published with the models. The real router:
tests/kernel/test_router_guest.py."""

from __future__ import annotations

from pathlib import Path

from governor.kernel import files as kf
from governor.rundir.journal import Journal
from governor.state.costs import CostBook, identity
from governor.supervise.loads import Loads

from .test_model_leaves import MovingFs
from .test_router_evict import (
    GROUP,
    LEAF,
    MIB,
    A,
    B,
    C,
    Clock,
    FakeRouter,
    _evict_tree,
    _leaves,
    _spawn,
    tree,  # noqa: F401  # the fixture
)

NOW = 1_700_000_000.0


def test_the_cheap_to_reload_model_goes_first_not_the_least_recently_used(
    tree: tuple[MovingFs, Path],  # noqa: F811
) -> None:
    """a is the least recently used but took 30 s to load; b was asked for 10 s ago but
    reloads in 2 s: c's 20 MiB deficit is covered by either, and b costs less to bring
    back (2 x 0.99 against 30 x 0.93 expected seconds)."""
    fs, proc = tree
    _evict_tree(fs, proc)  # 320 MiB over 300
    router = FakeRouter(fs, {"a": A, "b": B, "c": C})
    reload = {"a": 30.0, "b": 2.0}
    leaves, ev = _leaves(fs, proc, router, reload_s=reload.get, wall=lambda: NOW)
    ev.activity.last.update({"a": NOW - 60, "b": NOW - 10})
    leaves.poll()
    assert router.unloaded == ["b"]
    # without measured loads every model weighs the same: the least recently used one
    assert ev.by_value(["a", "b"], 20 * MIB) == ["b", "a"]
    ev.reload_s = lambda _a: None
    assert ev.by_value(["a", "b"], 20 * MIB) == ["a", "b"]


def test_the_one_that_alone_covers_goes_before_cheaper_ones_that_do_not(
    tree: tuple[MovingFs, Path],  # noqa: F811
) -> None:
    fs, proc = tree
    _evict_tree(fs, proc, budget=str(210 * MIB))  # 230 MiB with c: 20 missing
    router = FakeRouter(fs, {"a": A, "b": B, "c": C})
    leaves, ev = _leaves(fs, proc, router, reload_s={"a": 30.0, "b": 2.0}.get, wall=lambda: NOW)
    ev.claims["b"] = 10 * MIB  # b frees 10 MiB of the 20 missing: a must go
    ev.activity.last.update({"a": NOW - 60, "b": NOW - 10})
    leaves.poll()
    assert router.unloaded == ["a"]


def test_a_model_that_cannot_fit_beside_the_busy_one_unloads_no_idle_one(
    tree: tuple[MovingFs, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 46 item 4: a answers a request, b is idle; c beside a and the router needs
    220 MiB of a 200 MiB budget. Unloading b cannot make room: b stays loaded (LRU eviction
    unloaded it, then thawed c into an OOM kill), c's child is stopped at once."""
    fs, proc = tree
    _evict_tree(fs, proc, budget=str(200 * MIB))
    router = FakeRouter(fs, {"a": A, "b": B, "c": C}, busy={"a"})
    journal = Journal(tmp_path / "run" / "r")
    leaves, _ = _leaves(fs, proc, router, journal)
    leaves.poll()
    assert router.unloaded == []
    assert fs.procs(f"{GROUP}/models/b") == [B]
    assert fs.procs(f"{GROUP}/models/c") == []
    (entry,) = journal.entries()
    assert "every idle model unloaded frees 100 MiB, over 200 MiB" in entry["error"]


def test_a_model_that_fits_once_the_idle_ones_go_is_not_refused(
    tree: tuple[MovingFs, Path],  # noqa: F811
) -> None:
    fs, proc = tree
    _evict_tree(fs, proc, budget=str(220 * MIB))  # a busy; b idle; c fits once b is gone
    router = FakeRouter(fs, {"a": A, "b": B, "c": C}, busy={"a"})
    leaves, _ = _leaves(fs, proc, router)
    leaves.poll()
    assert router.unloaded == ["b"]
    assert fs.procs(f"{GROUP}/models/c") == [C]


class Statuses:
    """The router's GET /models as a table the test moves."""

    def __init__(self) -> None:
        self.table: dict[str, str] = {}
        self.asked = 0

    def models(self) -> dict[str, str]:
        self.asked += 1
        return dict(self.table)


def _child(alias: str, model: str) -> bytes:
    return f"/opt/llama/bin/llama-server\0--alias\0{alias}\0--model\0{model}\0".encode()


def test_a_load_is_timed_from_its_placement_to_the_routers_first_loaded_and_kept(
    tree: tuple[MovingFs, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    fs, proc = tree
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"GGUF" + bytes(60))
    mono = Clock(100.0)
    router = Statuses()
    book = CostBook(tmp_path / "cache")
    answered: list[str] = []
    loads = Loads(fs, GROUP, client=router, book=book, clock=mono, wall=lambda: NOW,  # type: ignore[arg-type]
                  on_loaded=answered.append)  # fmt: skip
    from governor.supervise.models import ModelLeaves

    leaves = ModelLeaves(
        fs, group=GROUP, leaf=LEAF, limits={}, router_pid=lambda: 100, proc_root=proc,
        loads=loads, clock=mono,
    )  # fmt: skip
    _spawn(fs, proc, 101, _child("t", str(weights)))
    assert leaves.poll() == [(101, "t")]
    router.table = {"t": "loading"}
    mono.now += 1.0
    assert leaves.tick() is False and loads.pending and answered == []
    (fs.root / GROUP / "models" / "t" / kf.MEMORY_CURRENT).write_text(f"{42 * MIB}\n")
    router.table = {"t": "loaded"}
    mono.now += 2.5
    leaves.tick()
    assert leaves.published()["models"]["t"] == {
        "last_request": None, "leaf": "t", "load_s": 3.5, "bytes": 42 * MIB
    }  # fmt: skip
    assert answered == ["t"]  # router_leaves dates its activity then (peer/router.py FRESH_S)
    asked = router.asked
    mono.now += 10
    leaves.tick()
    assert router.asked == asked  # nothing pending: the router is not asked
    key = identity(weights)
    assert key is not None and book.read()[key].load_s == 3.5
    # the next run knows it before its first load answers
    again = Loads(fs, GROUP, client=router, book=book, clock=mono)  # type: ignore[arg-type]
    again.start("t", weights)
    assert again.reload_s("t") == 3.5


def test_models_of_one_file_weigh_alike_whichever_alias_loaded_last(
    tree: tuple[MovingFs, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    """A CI guest run timed b's load at ~10 s and c's (the same file) at ~3: the evictor took
    c, used last, as three times cheaper to bring back. Aliases of one file share its latest
    load; a model of another file keeps its own."""
    fs, _proc = tree
    one, other = tmp_path / "one.gguf", tmp_path / "other.gguf"
    one.write_bytes(b"GGUF" + bytes(60))
    other.write_bytes(b"GGUF" + bytes(61))
    mono = Clock(0.0)
    router = Statuses()
    loads = Loads(fs, GROUP, client=router, book=CostBook(None), clock=mono)  # type: ignore[arg-type]
    for alias, model, took in (("b", one, 10.0), ("c", one, 3.0), ("x", other, 7.0)):
        loads.start(alias, model)
        mono.now += took
        router.table = {alias: "loaded"}
        assert loads.check() is True
    assert loads.costs["b"].load_s == 10.0  # each alias's own load is still what it showed
    assert [loads.reload_s(a) for a in ("b", "c", "x")] == [3.0, 3.0, 7.0]
    loads.start("d", None)  # a child whose file is not known: its own measurement only
    assert loads.reload_s("d") is None


def test_a_load_that_stopped_before_it_answered_is_no_measurement(
    tree: tuple[MovingFs, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    fs, _proc = tree
    mono = Clock(0.0)
    router = Statuses()
    loads = Loads(fs, GROUP, client=router, book=CostBook(None), clock=mono, poll_s=0.25)  # type: ignore[arg-type]
    loads.start("x", None)
    router.table = {"x": "loading"}
    assert loads.check() is False
    mono.now += 0.1
    router.table = {"x": "loaded"}
    assert loads.check() is False  # asked 0.1 s ago: not again yet
    router.table = {"x": "failed"}
    mono.now += 0.2
    assert loads.check() is False and not loads.pending and loads.reload_s("x") is None
    # a frozen one's load starts at its thaw
    loads.start("y", None)
    mono.now += 50
    loads.restart("y")
    mono.now += 4
    router.table = {"y": "loaded"}
    assert loads.check() is True and loads.reload_s("y") == 4.0


def test_a_model_that_waited_frozen_for_room_is_timed_from_its_thaw(
    tree: tuple[MovingFs, Path],  # noqa: F811
) -> None:
    """The seconds c waited frozen while a was unloaded are the eviction's, not c's load."""
    fs, proc = tree
    _evict_tree(fs, proc)
    mono = Clock(100.0)

    class Slow(FakeRouter):
        def unload(self, model: str) -> bool:
            mono.now += 5.0  # the unloaded child takes 5 s to go
            return super().unload(model)

    router = Slow(fs, {"a": A, "b": B, "c": C})
    leaves, _ = _leaves(fs, proc, router)
    leaves.loads = Loads(fs, GROUP, client=router, book=CostBook(None), clock=mono)  # type: ignore[arg-type]
    leaves.poll()
    assert router.unloaded == ["a"]
    assert leaves.loads.pending["c"][0] == 105.0  # its thaw, not its placement at 100
