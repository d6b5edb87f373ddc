"""Issue 38 item 3 and the router's publication on a fake cgroup tree: each model's last
request sampled and published at most once a second (RunState.router), and
``[engine] evict = "memory"``: a new child that would not fit waits frozen in its leaf while
the least recently used idle models are unloaded. The real router: tests/kernel/
test_router_guest.py."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from helpers.peers import StandIn, trickle

from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.peer.router import RouterClient, RouterError
from governor.plan.router import ROUTER_OWN_BYTES
from governor.record import replace
from governor.rundir.journal import Journal
from governor.rundir.state import RunState, check_state
from governor.supervise.activity import Activity
from governor.supervise.evict import Evictor
from governor.supervise.models import PUBLISH_S, SAMPLE_S, ModelLeaves, ModelLimits

from .fakekernel import FakeKernelCgroupFs
from .plans import make_plan
from .test_model_leaves import MovingFs

MIB = 1 << 20
GROUP = "governor.slice/r"
LEAF = f"{GROUP}/engine"
ROUTER = b"/opt/llama/bin/llama-server\0--models-dir\0/m\0-c\0256\0"


def _child(alias: str) -> bytes:
    return b"/opt/llama/bin/llama-server\0--alias\0" + alias.encode() + b"\0--model\0/m/x.gguf\0"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tree(cgroup_root: Path, tmp_path: Path) -> tuple[MovingFs, Path]:
    fs = MovingFs(cgroup_root)
    fs.enable("", ["memory", "cpu"])
    fs.mkdir("governor.slice")
    fs.enable("governor.slice", ["memory", "cpu"])
    fs.mkdir(GROUP)
    fs.mkdir(LEAF)
    proc = tmp_path / "proc"
    _spawn(fs, proc, 100, ROUTER)
    return fs, proc


def _spawn(fs: MovingFs, proc: Path, pid: int, cmdline: bytes) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cmdline").write_bytes(cmdline)
    fs.add_process(LEAF, pid)


def _usage(fs: MovingFs, alias: str, usec: int) -> None:
    path = fs.root / GROUP / "models" / alias / kf.CPU_STAT
    path.write_text(f"usage_usec {usec}\nuser_usec {usec}\nsystem_usec 0\n")


def test_placement_and_activity_are_published_at_most_once_per_interval(
    tree: tuple[MovingFs, Path],
) -> None:
    fs, proc = tree
    mono, wall = Clock(), Clock(1_700_000_000.0)
    published: list[dict[str, Any]] = []
    leaves: ModelLeaves
    leaves = ModelLeaves(
        fs, group=GROUP, leaf=LEAF, limits={"a": ModelLimits(), "b": ModelLimits()},
        router_pid=lambda: 100, proc_root=proc, activity=Activity(fs, GROUP, clock=wall),
        on_change=lambda: published.append(leaves.published()), clock=mono,
    )  # fmt: skip
    assert leaves.tick() is False  # nothing happened: nothing rewritten
    _spawn(fs, proc, 101, _child("a"))
    leaves.poll()
    _usage(fs, "a", 0)
    mono.now += SAMPLE_S
    assert leaves.tick() is True  # the placement dates a's load; a's usage sampled
    assert published[-1]["models"] == {
        "a": {"last_request": 1_700_000_000.0, "leaf": "a"},
        "b": {"last_request": None, "leaf": "b"},
    }  # fmt: skip
    # a's leaf uses CPU (a request) within the interval: sampled, but not published yet
    wall.now += 5
    mono.now += SAMPLE_S
    _usage(fs, "a", 50_000)
    assert leaves.tick() is False
    assert len(published) == 1
    mono.now += PUBLISH_S - SAMPLE_S
    assert leaves.tick() is True
    assert published[-1]["models"]["a"] == {"last_request": 1_700_000_005.0, "leaf": "a"}
    # an idle leaf (no CPU) moves nothing: no republication however long it idles
    for _ in range(5):
        mono.now += PUBLISH_S
        assert leaves.tick() is False
    leaves.count_unload("a", "memory")
    leaves.count_unload("a", "memory")
    assert leaves.tick() is True
    assert published[-1]["unloads"] == [{"model": "a", "reason": "memory", "count": 2}]


def test_the_router_state_round_trips_and_check_state_takes_it() -> None:
    router = {
        "url": "http://127.0.0.1:8080",
        "models": {"a": {"last_request": 1_700_000_000.5}, "b": {"last_request": None}},
        "unloads": [{"model": "a", "reason": "memory", "count": 1}],
    }
    state = RunState(
        policy="r", source="launch", policy_path=None, pid=1, started_at=1.0,
        backend="cgroupfs", cgroup_root="/sys/fs/cgroup", group=GROUP, leaf=LEAF,
        plan=None, router=router,
    )  # fmt: skip
    data = state.to_json()
    assert data["router"] == router
    assert RunState.read(data).router == router
    bad = {**router, "unloads": [{"model": "a", "reason": "memory", "count": "1"}]}
    assert check_state({**data, "format": 1, "router": bad}) is not None
    # issue 46: each model's measured load; what the slice costs to bring back is their sum
    assert RunState.read(data).reload_s() is None  # none measured
    measured = {**router, "models": {"a": {"last_request": None, "load_s": 2.5, "bytes": 7},
                                     "b": {"last_request": None, "load_s": 4}}}  # fmt: skip
    assert check_state({**data, "format": 1, "router": measured}) is None
    assert RunState.read({**data, "router": measured}).reload_s() == 6.5
    for m in ({"load_s": "2"}, {"load_s": 1, "bytes": 1.5}, {"bytes": True}):
        odd = {**router, "models": {"a": {"last_request": None, **m}}}
        assert check_state({**data, "format": 1, "router": odd}) is not None, m


def test_a_router_launch_publishes_its_base_url_from_host_and_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from governor.api.launch import router_url

    monkeypatch.delenv("LLAMA_ARG_HOST", raising=False)
    monkeypatch.setenv("LLAMA_ARG_PORT", "9000")
    argv = ("llama-server", "--models-dir", "/m", "--host", "0.0.0.0")
    assert router_url({"router": {"a": 1}}, argv) == "http://127.0.0.1:9000"
    assert router_url({"router": {}}, (*argv, "--port", "41233")) == "http://127.0.0.1:41233"
    assert router_url({"model": "x.gguf", "total": 1}, argv) is None  # no router
    assert router_url(None, argv) is None


# --- [engine] evict = "memory" ------------------------------------------------------------

A, B, C = 101, 102, 103


class FakeRouter:
    """The router's side: which models run, which are busy; an unload ends the child (its
    pid leaves its leaf) after ``exit_polls`` looks at its leaf. Every call recorded in
    ``fs.writes`` (the one order of events)."""

    def __init__(self, fs: MovingFs, pids: dict[str, int], busy: Iterable[str] = ()) -> None:
        self.fs = fs
        self.pids = pids
        self.busy_set = set(busy)
        self.unloaded: list[str] = []

    def within(self, budget_s: float) -> FakeRouter:  # RouterClient.within: no clock here
        return self

    def models(self) -> dict[str, str]:
        return {a: "loaded" if a not in self.unloaded else "unloaded" for a in self.pids}

    def busy(self, model: str) -> bool | None:
        return model in self.busy_set

    def unload(self, model: str) -> bool:
        self.fs.writes.append(("router", "unload", model))
        self.unloaded.append(model)
        self.exit(self.pids[model])
        return True

    def exit(self, pid: int) -> None:
        """The unloaded child's exit: gone at once (test_router_slots.py _SlowExit: slowly)."""
        self.fs.reap(pid)


def _evict_tree(
    fs: MovingFs, proc: Path, *, budget: str = str(300 * MIB), router_current: int = 20 * MIB
) -> None:
    fs.write(GROUP, kf.MEMORY_MAX, budget)
    (fs.root / LEAF / kf.MEMORY_CURRENT).write_text(f"{router_current}\n")
    fs.enable(GROUP, ["memory"])  # as ModelLeaves does at its first placement
    fs.mkdir(f"{GROUP}/models")
    fs.enable(f"{GROUP}/models", ["memory"])
    for alias, pid in (("a", A), ("b", B)):
        fs.mkdir(f"{GROUP}/models/{alias}")
        fs.add_process(f"{GROUP}/models/{alias}", pid)
    _spawn(fs, proc, C, _child("c"))
    fs.writes.clear()


def _leaves(
    fs: MovingFs, proc: Path, router: FakeRouter, journal: Any = None, **kw: Any
) -> tuple[ModelLeaves, Evictor]:
    activity = Activity(fs, GROUP)
    activity.last.update({"a": 1000.0, "b": 2000.0})  # a is the least recently used
    evictor = Evictor(
        fs, group=GROUP, leaf=LEAF, client=router, activity=activity,  # type: ignore[arg-type]
        claims={"a": 100 * MIB, "b": 100 * MIB, "c": 100 * MIB}, journal=journal,
        sleep=lambda _s: None, **kw,
    )  # fmt: skip
    leaves = ModelLeaves(
        fs, group=GROUP, leaf=LEAF, limits={}, router_pid=lambda: 100, proc_root=proc,
        activity=activity, evictor=evictor,
    )  # fmt: skip
    evictor.on_unload = leaves.count_unload
    return leaves, evictor


def test_the_arithmetic_claims_estimates_then_leaf_max_then_current_plus_the_router(
    tree: tuple[MovingFs, Path],
) -> None:
    fs, proc = tree
    _evict_tree(fs, proc)
    router = FakeRouter(fs, {"a": A, "b": B, "c": C})
    _, ev = _leaves(fs, proc, router)
    # 100 + 100 (a, b loaded) + 20 (the router's memory.current) + 100 (c) over 300
    assert ev.used("c") == 320 * MIB
    assert ev.over("c") == (320 * MIB, 300 * MIB)
    # no estimate for b: its leaf's memory.max; none either: its memory.current
    del ev.claims["b"]
    fs.write(f"{GROUP}/models/b", kf.MEMORY_MAX, str(150 * MIB))
    assert ev.claim("b") == 150 * MIB
    fs.write(f"{GROUP}/models/b", kf.MEMORY_MAX, "max")
    (fs.root / GROUP / "models" / "b" / kf.MEMORY_CURRENT).write_text(f"{7 * MIB}\n")
    assert ev.claim("b") == 7 * MIB
    # an unloaded model (its leaf stays, with no process) claims nothing
    fs.reap(B)
    assert ev.used("c") == 220 * MIB
    # the router's memory.current unreadable: the figure the estimate counts (issue 45 item 7)
    (fs.root / LEAF / kf.MEMORY_CURRENT).unlink()
    assert ev.used("c") == 200 * MIB + ROUTER_OWN_BYTES
    (fs.root / LEAF / kf.MEMORY_CURRENT).write_text(f"{20 * MIB}\n")
    # no memory.max on the group: the board's free budget; neither: no eviction at all
    fs.write(GROUP, kf.MEMORY_MAX, "max")
    ev.board_free = lambda: 200 * MIB
    assert ev.over("c") == (220 * MIB, 200 * MIB)
    ev.board_free = None
    assert ev.over("c") is None


def test_a_model_that_does_not_fit_enters_frozen_and_the_lru_idle_ones_go_first(
    tree: tuple[MovingFs, Path], tmp_path: Path
) -> None:
    fs, proc = tree
    _evict_tree(fs, proc, budget=str(200 * MIB))  # c needs both a and b gone: 320 -> 120
    router = FakeRouter(fs, {"a": A, "b": B, "c": C})
    journal = Journal(tmp_path / "run" / "r")
    leaves, _ = _leaves(fs, proc, router, journal)
    assert leaves.poll() == [(C, "c")]
    c = f"{GROUP}/models/c"
    events = [w for w in fs.writes if w[0] in (c, "router") and w[1] != kf.MEMORY_MAX]
    assert events == [
        (c, kf.CGROUP_FREEZE, "1"),  # frozen first: c enters frozen and allocates nothing
        (c, kf.CGROUP_PROCS, str(C)),
        ("router", "unload", "a"),  # least recently used first
        ("router", "unload", "b"),
        (c, kf.CGROUP_FREEZE, "0"),  # thawed once it fits
    ]
    assert fs.read(c, kf.CGROUP_FREEZE).strip() == "0"
    entries = journal.entries()
    assert [(e["source"], e["model"], e["reason"]) for e in entries] == [
        ("unload", "a", "room for c"), ("unload", "b", "room for c")
    ]  # fmt: skip
    assert leaves.published()["unloads"] == [
        {"model": "a", "reason": "memory", "count": 1},
        {"model": "b", "reason": "memory", "count": 1},
    ]
    # `governor status` shows them as the issue says
    from governor.operate.status import _journal_lines

    lines = _journal_lines({"journal": entries})
    assert lines[0].endswith("unload a: room for c") and lines[1].endswith("unload b: room for c")


def test_it_stops_unloading_once_the_new_model_fits(
    tree: tuple[MovingFs, Path],
) -> None:
    fs, proc = tree
    _evict_tree(fs, proc)  # 320 over 300: a alone makes room
    router = FakeRouter(fs, {"a": A, "b": B, "c": C})
    leaves, _ = _leaves(fs, proc, router)
    leaves.poll()
    assert router.unloaded == ["a"]
    assert fs.procs(f"{GROUP}/models/b") == [B]


def test_a_model_that_fits_is_placed_without_a_freeze(tree: tuple[MovingFs, Path]) -> None:
    fs, proc = tree
    _evict_tree(fs, proc, budget=str(400 * MIB))
    router = FakeRouter(fs, {"a": A, "b": B, "c": C})
    leaves, _ = _leaves(fs, proc, router)
    assert leaves.poll() == [(C, "c")]
    assert router.unloaded == []
    assert not [w for w in fs.writes if w[1] == kf.CGROUP_FREEZE]


def test_a_model_that_cannot_fit_beside_the_busy_ones_is_stopped_at_once_not_thawed(
    tree: tuple[MovingFs, Path], tmp_path: Path
) -> None:
    """Issue 46 item 4: a and b answer requests (not idle); c's 100 MiB beside them and the
    router is 320 MiB over 300: no unload can make room, so c's child is killed in its frozen
    leaf (it never allocates: no OOM kill) and one journal line names the numbers."""
    fs, proc = tree
    _evict_tree(fs, proc)
    router = FakeRouter(fs, {"a": A, "b": B, "c": C}, busy={"a", "b"})  # both answering
    journal = Journal(tmp_path / "run" / "r")
    leaves, _ = _leaves(fs, proc, router, journal)
    assert leaves.poll() == [(C, "c")]
    assert router.unloaded == []
    c = f"{GROUP}/models/c"
    assert fs.procs(c) == []  # killed while frozen
    assert (c, kf.CGROUP_KILL, "1") in fs.writes
    (entry,) = journal.entries()
    assert entry["source"] == "unload" and entry["model"] == "c"
    assert entry["error"] == (
        "c cannot fit: 320 MiB of claims with it (its own 100 MiB), every idle model unloaded"
        " frees 0 MiB, over 300 MiB: stopped, nothing unloaded"
    )
    assert leaves.published()["unloads"] == []


def test_an_unreadable_router_unloads_nothing_and_the_new_model_is_thawed(
    tree: tuple[MovingFs, Path], tmp_path: Path
) -> None:
    """What is idle is not known: nothing is refused on a guess, c is thawed and journaled."""
    fs, proc = tree
    _evict_tree(fs, proc)

    class Mute(FakeRouter):
        def models(self) -> dict[str, str]:
            raise RouterError("no answer")

    journal = Journal(tmp_path / "run" / "r")
    leaves, _ = _leaves(fs, proc, Mute(fs, {"a": A, "b": B, "c": C}), journal)
    assert leaves.poll() == [(C, "c")]
    c = f"{GROUP}/models/c"
    assert fs.procs(c) == [C]
    assert fs.read(c, kf.CGROUP_FREEZE).strip() == "0"
    (entry,) = journal.entries()
    assert "no idle model to unload for c" in entry["error"]
    assert "320 MiB of claims over 300 MiB" in entry["error"]


def test_the_new_model_is_thawed_whatever_the_eviction_raises(
    tree: tuple[MovingFs, Path],
) -> None:
    fs, proc = tree
    _evict_tree(fs, proc)

    class Broken(FakeRouter):
        def unload(self, model: str) -> bool:
            raise GovernorError("the group went away")

    leaves, _ = _leaves(fs, proc, Broken(fs, {"a": A, "b": B, "c": C}))
    with pytest.raises(GovernorError):
        leaves.poll()
    c = f"{GROUP}/models/c"
    assert fs.read(c, kf.CGROUP_FREEZE).strip() == "0"
    assert [w[2] for w in fs.writes if w[:2] == (c, kf.CGROUP_FREEZE)] == ["1", "0"]


def test_a_slow_child_is_waited_for_at_most_the_bound(tree: tuple[MovingFs, Path]) -> None:
    fs, proc = tree
    _evict_tree(fs, proc)
    clock = Clock(0.0)

    class Slow(FakeRouter):
        def unload(self, model: str) -> bool:
            self.unloaded.append(model)
            return True  # taken, but its child never exits

    router = Slow(fs, {"a": A, "b": B, "c": C})
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        clock.now += s

    leaves, ev = _leaves(fs, proc, router)
    ev.sleep, ev.clock, ev.wait_s = sleep, clock, 2.0
    leaves.poll()
    # a never exits: waited 2 s, then b (the next idle one); neither frees anything, so
    # nothing idle is left and c is thawed
    assert router.unloaded == ["a", "b"]
    assert 3.9 <= clock.now <= 4.2
    assert fs.read(f"{GROUP}/models/c", kf.CGROUP_FREEZE).strip() == "0"


def test_the_board_free_budget_is_the_budget_less_every_other_slices_claim(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The supervisor's model leaves hand the evictor the board's free budget
    (governor/board/scan.py free_for; issue 44: no closure wired into the run time by api/),
    read from one scan of the run directory and root they were given."""
    from governor.board.budget import Budget
    from governor.board.scan import Board
    from governor.board.slice import QosClass, Slice
    from governor.supervise.models import router_leaves

    def claim(name: str, peak: int) -> Slice:
        return Slice(name=name, cgroup=f"g/{name}", qos=QosClass("standard"), min=0, peak=peak,
                     peak_source="max")  # fmt: skip

    seen = Board(
        budget=Budget.of(2048 * MIB, 256 * MIB),
        slices=(claim("r", 900 * MIB), claim("chat", 700 * MIB), claim("bg", 200 * MIB)),
    )
    scanned: list[dict[str, object]] = []

    def fake_scan(**kw: object) -> Board:
        scanned.append(kw)
        return seen

    monkeypatch.setattr("governor.board.scan.scan", fake_scan)
    plan = replace(make_plan(policy="r"), engine=replace(make_plan().engine, evict="memory"))
    leaves = router_leaves(
        FakeKernelCgroupFs(tmp_path), plan, limits={}, router_url="http://127.0.0.1:8080",
        claims={}, board=(tmp_path / "run", tmp_path), journal=None,
        router_pid=lambda: None, proc_root=tmp_path, on_change=None,
    )  # fmt: skip
    assert leaves.evictor is not None and leaves.evictor.board_free is not None
    assert leaves.evictor.board_free() == (2048 - 256 - 700 - 200) * MIB  # not its own ("r")
    assert scanned == [{"run": tmp_path / "run", "cgroup_root": Path(plan.cgroup_root),
                        "root": tmp_path}]  # fmt: skip
    # the lowered budget's memory.high reads the cap of this router's run dir (rundir/cap.py)
    from governor.rundir import cap as caps
    from governor.rundir.liveness import own_start

    high = leaves.cap_high
    assert high is not None and high.evictor is leaves.evictor and high.cap() is None
    (tmp_path / "proc").symlink_to("/proc")
    caps.write(tmp_path / "run" / "r", caps.Cap(
        by="chat", pid=os.getpid(), pid_start=own_start(), budget=1, own=0, before=2,
        models=("a",), at=1.0))  # fmt: skip
    held = high.cap()
    assert held is not None and held.by == "chat"
    rounds: list[float] = []
    high.sync = lambda: rounds.append(1.0)  # type: ignore[method-assign]
    leaves.tick()  # the router thread's step
    assert rounds == [1.0]


def test_router_leaves_evicts_only_under_evict_memory(tmp_path: Path) -> None:
    from governor.supervise.models import router_leaves

    class _Plan:
        group, leaf = GROUP, LEAF
        engine = type("E", (), {"evict": "memory"})()

    def build(plan: Any, url: str | None) -> ModelLeaves:
        return router_leaves(
            FakeKernelCgroupFs(tmp_path), plan, limits={}, router_url=url,
            claims={"a": 1, "b": "?"}, board=(tmp_path, tmp_path), journal=None,
            router_pid=lambda: None, proc_root=tmp_path, on_change=None,
        )  # fmt: skip

    leaves = build(_Plan(), "http://127.0.0.1:8080")
    assert leaves.evictor is not None and leaves.activity is not None
    assert leaves.evictor.claims == {"a": 1}
    assert leaves.evictor.on_unload == leaves.count_unload
    assert build(_Plan(), None).evictor is None  # no url: no router to ask
    _Plan.engine = type("E", (), {"evict": "count"})()
    counted = build(_Plan(), "http://127.0.0.1:8080")
    assert counted.evictor is None and counted.activity is not None
    assert counted.cap_high is None  # no cap without the evictor that holds it


def test_the_governors_own_slot_probes_are_not_dated_as_requests(
    tree: tuple[MovingFs, Path], tmp_path: Path
) -> None:
    fs, proc = tree
    _evict_tree(fs, proc)
    for alias in ("a", "b"):
        _usage(fs, alias, 1000)
    router = FakeRouter(fs, {"a": A, "b": B, "c": C})
    leaves, ev = _leaves(fs, proc, router)
    ev.activity.sample()  # the base: a and b keep their last requests (1000, 2000)
    real_busy = router.busy

    def probed(model: str) -> bool | None:
        _usage(fs, model, 50_000)  # answering /slots costs the child CPU
        return real_busy(model)

    router.busy = probed  # type: ignore[method-assign]
    leaves.poll()  # c does not fit: a (LRU) unloaded, b probed
    assert router.unloaded == ["a"]
    assert ev.activity.sample() is False  # b's probe was no request
    assert ev.activity.last["b"] == 2000.0


def test_a_stalled_router_never_holds_a_placement_and_the_frozen_model_is_thawed_in_time(
    tree: tuple[MovingFs, Path],
) -> None:
    """Issue 43 item 1: the placement thread never talks to the router. c does not fit and
    enters its leaf frozen; the router trickles (a byte per 0.2 s), so making room for c
    waits on it; d, started meanwhile, is placed all the same before c's thaw, and c is
    thawed once its round's calls ran out of time (the unbounded client held both)."""
    fs, proc = tree
    _evict_tree(fs, proc)
    slow = StandIn(trickle(b'HTTP/1.0 200 OK\r\n\r\n{"data": []}', interval_s=0.2))
    client = RouterClient(slow.url, timeout=3.0)
    leaves, _ = _leaves(fs, proc, client)  # type: ignore[arg-type]
    c, d = f"{GROUP}/models/c", f"{GROUP}/models/d"
    t0 = time.monotonic()
    leaves.start()
    try:
        _until(lambda: (c, kf.CGROUP_PROCS, str(C)) in fs.writes, "c placed")
        _spawn(fs, proc, 104, _child("d"))
        _until(lambda: (d, kf.CGROUP_PROCS, "104") in fs.writes, "d placed")
        _until(lambda: (c, kf.CGROUP_FREEZE, "0") in fs.writes, "c thawed")
        took = time.monotonic() - t0
    finally:
        leaves.stop()
        slow.close()
    order = [w for w in fs.writes if w[0] in (c, d) and w[1] != kf.MEMORY_MAX]
    assert order.index((d, kf.CGROUP_PROCS, "104")) < order.index((c, kf.CGROUP_FREEZE, "0"))
    assert fs.procs(d) == [104] and fs.read(c, kf.CGROUP_FREEZE).strip() == "0"
    assert took < 20  # did not hang: a round is at most ROUND_S, each call at most 3 s


def _until(ok: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < end, f"not within {timeout}s: {what}"
        time.sleep(0.01)
