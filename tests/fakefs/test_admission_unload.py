"""Admission's shed unloads a lower-class router's idle models under a lowered budget (issue 46)
on a fake cgroup tree, against a tiny HTTP server that answers as llama-server's router does
(tests/fakefs/test_unload.py FakeRouter): the whole path of a launch's admission (the board
scan, the router's rooms, the cap, the unload, the journal), the budget given back when the
admitted tenant's process is gone, a failed unload that leaves nothing applied, and the
router's evictor keeping its loads under the lowered budget. The real router:
tests/kernel/test_router_unload_guest.py."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.api.admit import admission, router_rooms
from governor.board import unloading
from governor.board.budget import MIB, slice_of_plan
from governor.board.scan import scan
from governor.board.unload import Unload
from governor.errors import AdmissionRefused, GovernorError
from governor.kernel import files
from governor.kernel.leafname import model_cgroup
from governor.operate.boardview import claim_row, fits, peak_said
from governor.operate.status import _journal_lines
from governor.peer.router import RouterClient
from governor.plan.model import CgroupWrite, EngineSpec, Plan, QosSpec
from governor.record import replace
from governor.rundir import cap as caps
from governor.rundir.journal import Journal
from governor.rundir.liveness import own_start
from governor.rundir.state import Publisher
from governor.supervise.activity import Activity
from governor.supervise.caphigh import SYNC_S, CapHigh
from governor.supervise.evict import Evictor

from .fakekernel import FakeKernelCgroupFs
from .plans import make_plan
from .test_shed import Board
from .test_unload import FakeRouter, _router_state

ROUTER_GROUP = "governor.slice/router"
CHAT_GROUP = "governor.slice/chat"
ESTIMATES = {"a": 300 * MIB, "b": 400 * MIB, "c": 200 * MIB}
LAST = {"a": 100.0, "b": 200.0, "c": 50.0}


def _plan(name: str, group: str, qos: QosSpec, limit: int | None, evict: str = "none") -> Plan:
    writes = (
        () if limit is None else (CgroupWrite(group, "memory.max", str(limit), "max", "memory"),)
    )
    p = make_plan(policy=name, group=group, leaf=f"{group}/engine", writes=writes)
    return replace(p, qos=qos, engine=replace(EngineSpec(), evict=evict))


@pytest.fixture
def router() -> Iterator[FakeRouter]:
    r = FakeRouter({"a": "loaded", "b": "loaded", "c": "loaded"}, busy={"c"})
    yield r
    r.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """/proc as it is (the launches' liveness, MemTotal), no /sys (no zram), no manifests."""
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "proc").symlink_to("/proc")
    return tmp_path / "root"


def _memtotal() -> int:
    line = next(
        x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal:")
    )
    return int(line.split()[1]) << 10


def _setup(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter
) -> tuple[Board, Plan, Path]:
    """A background router (1200 MiB estimate: itself 100 MiB, a 300 and b 400 idle, c 200 busy)
    published by this process; a board whose budget leaves chat's 512 MiB peak 250 MiB short."""
    board = Board(fake_fs, tmp_path / "run")
    rplan = board.publish(
        _plan("router", ROUTER_GROUP, QosSpec(qos_class="background"), None, "memory"),
        0,
        launched=True,
    )
    (fake_fs.path(rplan.leaf) / files.MEMORY_CURRENT).write_text(f"{100 * MIB}\n")
    pid = os.getpid()
    st = replace(
        _router_state(rplan, router.url, pid, LAST), pid_start=own_start(),  # type: ignore[arg-type]
        model={"total": 1200 * MIB, "router": ESTIMATES},
    )  # fmt: skip
    Publisher(board.run, "router").publish(st)
    chat = board.here(
        _plan(
            "chat",
            CHAT_GROUP,
            QosSpec(qos_class="interactive", admit="shed", admit_timeout_s=5.0),
            512 * MIB,
        )
    )
    path = tmp_path / "board.toml"
    path.write_text(f'[board]\nreserve = "{(_memtotal() >> 20) - (1200 + 512 - 250)}MiB"\n')
    return board, chat, path


def _admit(chat: Plan, board: Board, path: Path, root: Path, lines: list[str]) -> str | None:
    got = admission(
        chat, run=board.run, root=root, board=path, sleep=lambda _s: None, say=lines.append
    )
    got.release()
    return got.note


def test_a_shed_admission_unloads_the_coldest_idle_model_and_lowers_the_routers_budget(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, root: Path
) -> None:
    board, chat, path = _setup(fake_fs, tmp_path, router)
    lines: list[str] = []
    note = _admit(chat, board, path, root, lines)
    assert router.unloaded == ["a"]  # the colder of the two that cover; never c (busy)
    assert note == "admitted after unloading a from router (a lower class)"
    assert lines == [
        "admission of chat unloaded a from router router (a lower class), router's budget"
        " 1200 MiB -> 700 MiB until chat ends",
        "chat admitted: admitted after unloading a from router (a lower class)",
    ]
    cap = caps.read(board.run / "router")
    assert cap is not None and (cap.by, cap.budget, cap.own, cap.models) == (
        "chat",
        700 * MIB,
        100 * MIB,
        ("a",),
    )
    (entry,) = [e for e in Journal(board.run / "router").entries() if e["source"] == "shed"]
    assert (entry["step"], entry["by"], entry["model"], entry["when"]) == (
        "unload",
        "chat",
        "a",
        "admission of chat",
    )
    (said,) = _journal_lines({"journal": [entry], "policy": "router"})
    assert said.endswith(
        " shed: unload a by chat (router's budget 1200 MiB -> 700 MiB until chat ends)"
    )
    # the board sees the lowered claim while chat's process (this one) runs
    seen = {s.name: s for s in scan(run=board.run, cgroup_root=fake_fs.root, root=root).slices}
    assert seen["router"].peak_claim == 700 * MIB and seen["router"].capped_by == "chat"
    row = claim_row(seen["router"])  # `governor board` says it
    assert (row["lowered_by"], peak_said(row)) == ("chat", "estimate, lowered by chat")


def test_the_budget_is_given_back_once_the_admitted_tenants_process_is_gone(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, root: Path
) -> None:
    board, chat, path = _setup(fake_fs, tmp_path, router)
    _admit(chat, board, path, root, [])
    gone = subprocess.Popen(["true"])
    gone.wait()
    held = json.loads((board.run / "router" / caps.CAP_FILE).read_text())
    (board.run / "router" / caps.CAP_FILE).write_text(json.dumps({**held, "pid": gone.pid}))
    assert caps.read(board.run / "router") is None
    seen = {s.name: s for s in scan(run=board.run, cgroup_root=fake_fs.root, root=root).slices}
    assert seen["router"].peak_claim == 1200 * MIB and seen["router"].capped_by is None
    # a cap another tenant holds is never removed in its place
    assert not caps.remove(board.run / "router", "tts", os.getpid())


def test_a_failed_unload_leaves_nothing_applied_and_refuses_with_75(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, root: Path
) -> None:
    board, chat, path = _setup(fake_fs, tmp_path, router)
    router.close()  # the router stops answering between its rooms and the unload
    seen = scan(run=board.run, cgroup_root=fake_fs.root, root=root)
    r = next(s for s in seen.slices if s.name == "router")
    u = Unload(
        router=r, models=("a",), before=1200 * MIB, budget=700 * MIB, own=100 * MIB, frees=500 * MIB
    )
    with pytest.raises(GovernorError) as failed:
        unloading.apply(u, run=board.run, by="chat", fs=fake_fs)
    assert str(failed.value) == (
        f"router router did not unload a ({router.url}); its budget is given back"
        f" ({board.run}/router/cap.json)"
    )
    assert not (board.run / "router" / caps.CAP_FILE).exists()
    assert [e for e in Journal(board.run / "router").entries() if e["source"] == "shed"] == []
    # through the admission: one line, 75, nothing stopped, no cap left (the router no
    # longer answers its /models: no room offered, and a stop alone does not cover)
    with pytest.raises(AdmissionRefused) as err:
        _admit(chat, board, path, root, [])
    assert err.value.exit_code == 75
    assert not (board.run / "router" / caps.CAP_FILE).exists()


def test_the_unload_calls_end_by_the_admissions_deadline_and_none_is_asked_after_it(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, root: Path
) -> None:
    board, _chat, _path = _setup(fake_fs, tmp_path, router)
    seen = scan(run=board.run, cgroup_root=fake_fs.root, root=root)
    r = next(s for s in seen.slices if s.name == "router")
    u = Unload(
        router=r, models=("a",), before=1200 * MIB, budget=700 * MIB, own=100 * MIB, frees=500 * MIB
    )
    budgets: list[float] = []

    class Timed(RouterClient):
        def within(self, budget_s: float) -> RouterClient:
            budgets.append(budget_s)
            return super().within(budget_s)

    clock = Clock()
    clock.now = 10.0
    # 1.5 s left of the admission: the unload's calls get that, not their own 5 s
    unloading.apply(u, run=board.run, by="chat", fs=fake_fs, client=Timed, clock=clock,
                    sleep=clock.sleep, deadline=11.5, timeout_s=5)  # fmt: skip
    assert budgets == [1.5] and router.unloaded == ["a"]
    caps.remove(board.run / "router", "chat", os.getpid())
    # none left: nothing asked, the budget given back, one line that says so
    with pytest.raises(GovernorError) as late:
        unloading.apply(u, run=board.run, by="chat", fs=fake_fs, client=Timed, clock=clock,
                        sleep=clock.sleep, deadline=10.0, timeout_s=5)  # fmt: skip
    assert str(late.value) == (
        "router's unload of a was not asked: the admission's time of admit_timeout 5 s ran out;"
        f" router's budget is given back ({board.run}/router/cap.json)"
    )
    assert budgets == [1.5] and router.unloaded == ["a"]
    assert not (board.run / "router" / caps.CAP_FILE).exists()


def test_check_and_board_fits_name_the_unloads_the_start_then_makes(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, root: Path
) -> None:
    board, chat, path = _setup(fake_fs, tmp_path, router)
    would = "unload a from router router (frees 500 MiB: router's budget 1200 MiB -> 700 MiB)"
    # `check` and `install`: admission without acting says the unloads and does none
    lines: list[str] = []
    admission(chat, run=board.run, root=root, board=path, hold=False, act=False,
              say=lines.append).release()  # fmt: skip
    (line,) = lines
    assert line.startswith("at its start chat will shed for room: ")
    assert line.endswith(f"; the shed would {would}")
    assert router.unloaded == [] and caps.read(board.run / "router") is None
    # `board --fits`: the same figures, from the same rooms
    seen = scan(run=board.run, cgroup_root=fake_fs.root, root=root, board=path)
    new = slice_of_plan(chat)
    out = fits(seen.budget, new, seen.slices, "shed", router_rooms(chat))
    assert out["line"].endswith(f'; admit = "shed" would {would}')
    assert out["unloads"] == [
        {"router": "router", "models": ["a"], "frees": 500 * MIB, "before": 1200 * MIB,
         "budget": 700 * MIB}
    ]  # fmt: skip
    assert out["victims"] == [] and out["enough"]
    # the start then does what they said
    _admit(chat, board, path, root, [])
    cap = caps.read(board.run / "router")
    assert router.unloaded == ["a"] and cap is not None and cap.budget == 700 * MIB


class Clock:
    """A fake monotonic clock its sleeps move."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _stuck(fake_fs: FakeKernelCgroupFs, alias: str) -> None:
    """``alias``'s leaf keeps its child: the router unloads it, the child does not exit."""
    leaf = model_cgroup(ROUTER_GROUP, alias)
    parts = leaf.split("/")
    for i in range(1, len(parts) + 1):
        fake_fs.mkdir("/".join(parts[:i]))  # with its interface files (cgroup.events)
    fake_fs.add_process(leaf, 4242)  # populated


def test_the_leaf_wait_after_an_unload_ends_at_the_admissions_deadline(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, root: Path
) -> None:
    board, chat, path = _setup(fake_fs, tmp_path, router)
    _stuck(fake_fs, "a")
    clock = Clock()
    said: list[str] = []
    with pytest.raises(AdmissionRefused) as err:
        admission(chat, run=board.run, root=root, board=path, clock=clock, sleep=clock.sleep,
                  say=said.append)  # fmt: skip
    assert err.value.exit_code == 75 and router.unloaded == ["a"]
    # the 20 s wait is cut to admit_timeout (5 s), the numbers said in the one line
    assert 5.0 <= clock.now < 5.5
    line = str(err.value).splitlines()[0]
    assert line.endswith(
        ", and router's model a still ran in its leaf 5.0 s after its unload, the admission's"
        f" 5.0 s left of admit_timeout 5 s ran out; router's budget is given back"
        f" ({board.run}/router/cap.json) ([qos] admit, {path})"
    )
    assert caps.read(board.run / "router") is None  # nothing half-applied


def test_the_leaf_wait_counts_only_the_time_the_admission_has_left(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, root: Path
) -> None:
    board, _chat, _path = _setup(fake_fs, tmp_path, router)
    _stuck(fake_fs, "a")
    r = next(s for s in scan(run=board.run, cgroup_root=fake_fs.root, root=root).slices
             if s.name == "router")  # fmt: skip
    u = Unload(router=r, models=("a",), before=1200 * MIB, budget=700 * MIB, own=100 * MIB,
               frees=500 * MIB)  # fmt: skip
    clock = Clock()
    clock.now = 100.0
    with pytest.raises(GovernorError, match=r"1\.5 s after its unload, the admission's 1\.5 s"):
        unloading.apply(u, run=board.run, by="chat", fs=fake_fs, clock=clock, sleep=clock.sleep,
                        deadline=101.5, timeout_s=5.0)  # fmt: skip
    assert 101.5 <= clock.now < 101.6 and not (board.run / "router" / caps.CAP_FILE).exists()
    # a child gone from cgroup.procs whose memory is still being freed holds the leaf too
    fake_fs.reap_slowly(4242)
    clock.now = 100.0
    with pytest.raises(GovernorError, match=r"1\.5 s after its unload"):
        unloading.apply(u, run=board.run, by="chat", fs=fake_fs, clock=clock, sleep=clock.sleep,
                        deadline=101.5, timeout_s=5.0)  # fmt: skip
    fake_fs.tear_down()
    _stuck(fake_fs, "a")
    # the admission's deadline after the wait's own 20 s: the wait ends as before, no refusal
    clock.now = 0.0
    unloading.apply(u, run=board.run, by="chat", fs=fake_fs, clock=clock, sleep=clock.sleep,
                    deadline=60.0, timeout_s=60.0)  # fmt: skip
    assert 20.0 <= clock.now < 20.1 and caps.read(board.run / "router") is not None


def test_the_routers_evictor_keeps_its_models_under_the_lowered_budget(
    fake_fs: FakeKernelCgroupFs, router: FakeRouter
) -> None:
    fake_fs.mkdir("governor.slice")
    fake_fs.mkdir(ROUTER_GROUP)
    fake_fs.mkdir(f"{ROUTER_GROUP}/engine")
    (fake_fs.path(ROUTER_GROUP) / files.MEMORY_MAX).write_text(f"{2048 * MIB}\n")
    (fake_fs.path(f"{ROUTER_GROUP}/engine") / files.MEMORY_CURRENT).write_text(f"{120 * MIB}\n")
    lowered: list[int | None] = [None]
    ev = Evictor(
        fake_fs, group=ROUTER_GROUP, leaf=f"{ROUTER_GROUP}/engine", client=RouterClient(router.url),
        activity=Activity(fake_fs, ROUTER_GROUP), claims=ESTIMATES, cap=lambda: lowered[0],
    )  # fmt: skip
    assert ev.budget() == 2048 * MIB
    lowered[0] = 600 * MIB  # the models' share: the router's own memory now is added to it
    assert ev.budget() == 720 * MIB
    lowered[0] = 4096 * MIB  # never above the group's own
    assert ev.budget() == 2048 * MIB


def _cap_high(
    fake_fs: FakeKernelCgroupFs, router: FakeRouter, run: Path, root: Path, clock: Clock
) -> CapHigh:
    """The router's CapHigh as router_leaves wires it: its evictor's leaves and claims, the cap
    read through rundir/cap.py held_for."""
    ev = Evictor(
        fake_fs, group=ROUTER_GROUP, leaf=f"{ROUTER_GROUP}/engine", client=RouterClient(router.url),
        activity=Activity(fake_fs, ROUTER_GROUP), claims=ESTIMATES,
    )  # fmt: skip
    rplan = _plan("router", ROUTER_GROUP, QosSpec(qos_class="background"), None, "memory")
    return CapHigh(ev, lambda: caps.held_for(rplan, run, root), clock=clock)


def test_while_the_budget_is_lowered_the_kept_models_leaves_get_memory_high_at_their_share(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, root: Path
) -> None:
    board, chat, path = _setup(fake_fs, tmp_path, router)
    leaves = {}
    fake_fs.mkdir(f"{ROUTER_GROUP}/models")
    for alias, current in (("b", 150 * MIB), ("c", 260 * MIB)):  # c, busy, above its 200
        cg = model_cgroup(ROUTER_GROUP, alias)
        fake_fs.mkdir(cg)
        (fake_fs.path(cg) / files.CGROUP_PROCS).write_text("4242\n")
        (fake_fs.path(cg) / files.MEMORY_CURRENT).write_text(f"{current}\n")
        leaves[alias] = fake_fs.path(cg) / files.MEMORY_HIGH
        leaves[alias].write_text("max\n")  # as its leaf was made (no memory.high planned)
    clock = Clock()
    high = _cap_high(fake_fs, router, board.run, root, clock)

    def sync() -> dict[str, str]:
        clock.sleep(SYNC_S)
        high.sync()
        return {a: f.read_text().strip() for a, f in leaves.items()}

    assert sync() == {"b": "max", "c": "max"}  # no cap: nothing written
    _admit(chat, board, path, root, [])  # a unloaded, the budget lowered while chat runs
    # each kept model at what the admission counted for it, never under what it holds
    assert sync() == {"b": str(400 * MIB), "c": str(260 * MIB)}
    leaves["c"].write_text("999\n")  # tuned by someone else meanwhile
    assert sync() == {"b": str(400 * MIB), "c": str(260 * MIB)}  # its share again
    leaves["c"].write_text("777\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    held = json.loads((board.run / "router" / caps.CAP_FILE).read_text())
    (board.run / "router" / caps.CAP_FILE).write_text(json.dumps({**held, "pid": gone.pid}))
    # chat gone: b's memory.high back as it was; c's, changed since, stays the other's
    assert sync() == {"b": "max", "c": "777"}


def test_the_share_is_compared_as_the_kernel_keeps_it_rounded_to_its_page_size(
    fake_fs: FakeKernelCgroupFs,
    tmp_path: Path,
    router: FakeRouter,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guest (2026-12-06): a share of memory.current's bytes reads back rounded down to the
    page size, every round took it for a tune by someone else, and the give-back left it."""
    board, chat, path = _setup(fake_fs, tmp_path, router)
    written = fake_fs.write

    def kernel_write(cgroup: str, file: str, value: str) -> None:  # mm/memcontrol.c
        if file == files.MEMORY_HIGH and value.isdigit():
            value = str(int(value) // 4096 * 4096)
        written(cgroup, file, value)

    monkeypatch.setattr(fake_fs, "write", kernel_write)
    fake_fs.mkdir(f"{ROUTER_GROUP}/models")
    cg = model_cgroup(ROUTER_GROUP, "c")
    fake_fs.mkdir(cg)
    fake_fs.add_process(cg, 4242)
    (fake_fs.path(cg) / files.MEMORY_CURRENT).write_text(f"{260 * MIB + 1234}\n")  # over 200
    high = fake_fs.path(cg) / files.MEMORY_HIGH
    high.write_text("max\n")
    clock = Clock()
    cap_high = _cap_high(fake_fs, router, board.run, root, clock)
    _admit(chat, board, path, root, [])
    for _ in range(3):
        clock.sleep(SYNC_S)
        cap_high.sync()
        assert high.read_text().strip() == str((260 * MIB + 1234) // 4096 * 4096)
    assert cap_high.held[cg] == ("max", high.read_text().strip())  # the first "before" kept
    gone = subprocess.Popen(["true"])
    gone.wait()
    held = json.loads((board.run / "router" / caps.CAP_FILE).read_text())
    (board.run / "router" / caps.CAP_FILE).write_text(json.dumps({**held, "pid": gone.pid}))
    clock.sleep(SYNC_S)
    cap_high.sync()
    assert high.read_text().strip() == "max"  # given back


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"by": "chat", "pid": 1, "budget": -1, "own": 0, "before": 0, "models": [], "at": 1}',
        b'{"by": "chat", "pid": true, "budget": 1, "own": 0, "before": 0, "models": [], "at": 1}',
        b'{"by": "chat", "pid": 1, "budget": 1, "own": 0, "before": 0, "models": [3], "at": 1}',
    ],
)
def test_a_cap_file_no_governor_writes_is_no_cap(tmp_path: Path, body: bytes) -> None:
    (tmp_path / caps.CAP_FILE).write_bytes(body)
    assert caps.parse(body) is None and caps.read(tmp_path) is None
    assert caps.models_budget(tmp_path) is None


def test_a_cap_behind_a_symlink_is_not_followed(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    held = caps.Cap(
        by="chat", pid=os.getpid(), pid_start=own_start(), budget=700 * MIB, own=100 * MIB,
        before=1200 * MIB, models=("a",), at=1.0,
    )  # fmt: skip
    caps.write(real, held)
    assert caps.read(real) == held and caps.models_budget(real) == 600 * MIB
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / caps.CAP_FILE).symlink_to(real / caps.CAP_FILE)
    assert caps.read(tmp_path / "router") is None
