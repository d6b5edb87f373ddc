"""The `shed` action (issue 23) on a fake cgroup tree: victims by class and size, the graded
ladder within `yield`, the settle time, the undo in reverse, the journal a victim's own
monitor takes as its baseline, the board file's ungoverned cgroups and the watchdog's list."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from governor.backends.cgroupfs import CgroupfsBackend
from governor.board.file import load_board
from governor.compile.compiler import compile_action, watch_rule
from governor.errors import PolicyError
from governor.kernel import files
from governor.kernel.procfs import ProcFs
from governor.monitor.actions.base import Context, Env
from governor.monitor.actions.executor import Executor
from governor.monitor.actions.shed import Shed
from governor.monitor.actions.shedder import RAISE_STEPS, ROOM_HEADROOM, SETTLE_S, Shedder
from governor.monitor.loop import Monitor
from governor.monitor.sources import Board as Readings
from governor.plan.model import Plan, QosSpec, ShedStep, WatchCondition, WatchTrigger
from governor.policy.values import parse_action
from governor.record import replace
from governor.rundir.journal import Journal
from governor.rundir.state import Publisher, applied

from .fakekernel import FakeKernelCgroupFs
from .plans import MEMORY_HIGH, WRITES, _w, make_plan

MIB = 1 << 20
CTX = Context(rule=0, when="board memory some 100ms/1s")
BATCH_HIGH = 1 << 30


def _plan(name: str, qos: QosSpec, *, high: int | None = None) -> Plan:
    group = f"governor.slice/{name}"
    writes = tuple(
        replace(w, cgroup=group)
        for w in WRITES
        if w.cgroup != "governor.slice" and w.file != files.MEMORY_MIN
    )
    if high is not None:
        writes = tuple(
            _w(group, w.file, str(high), "memory.high") if w.file == files.MEMORY_HIGH else w
            for w in writes
        )
    return replace(
        make_plan(policy=name, group=group, leaf=f"{group}/engine", writes=writes), qos=qos
    )


CHAT = QosSpec(qos_class="interactive")
BATCH = QosSpec(qos_class="background", yields=("throttle", "freeze"))


class Board:
    """Two governed slices applied and published as `governor apply` does."""

    def __init__(self, fs: FakeKernelCgroupFs, run: Path) -> None:
        self.fs, self.run = fs, run
        self.now = [100.0]
        self.reverts: list[list[tuple[str, str, str]]] = []

    def publish(self, plan: Plan, usage: int, *, launched: bool = False) -> Plan:
        """``plan`` applied with ``usage`` bytes in its group, published as `apply` leaves it
        (its claim stays after a stop: never stopped), or ``launched``: as a running launch
        publishes it (this process its governor: a stop frees its claim)."""
        plan = self.here(plan)
        CgroupfsBackend(self.fs).apply(plan)
        (self.fs.path(plan.group) / files.MEMORY_CURRENT).write_text(f"{usage}\n")
        state = applied(plan, policy_path=None, created=[], started_at=1.0)
        if launched:
            pid = os.getpid()
            state = replace(
                state, source="launch", pid=pid, pid_start=ProcFs().starttime(pid), created=None
            )
        Publisher(self.run, plan.policy).publish(state)
        return plan

    def here(self, plan: Plan) -> Plan:
        """``plan`` on this board's cgroup tree (an applied state holds while its group
        exists there: issue 43)."""
        return replace(plan, cgroup_root=str(self.fs.root))

    def shedder(self, plan: Plan, **kw: Any) -> Shedder:
        return Shedder(
            self.fs, self.here(plan), run=self.run, board=self.run / "board.toml", watchdog=self,
            clock=lambda: self.now[0], **kw,
        )  # fmt: skip

    def arm_shed(self, cgroup_root: str, reverts: list[tuple[str, str, str]]) -> None:
        self.reverts.append(reverts)

    def monitor(self, plan: Plan, proc: Path) -> Monitor:
        """The shedding policy's monitor on this board (its /proc files in ``proc``)."""
        proc.mkdir(exist_ok=True)
        return Monitor(
            Env(
                self.fs,
                plan,
                engine_pids=lambda: [],
                board=Readings(ProcFs(proc)),
                clock=lambda: self.now[0],
                journal=Journal(self.run / plan.policy),
                watchdog=self,
            )
        ).start()

    def tick(self, s: float = SETTLE_S) -> None:
        self.now[0] += s


@pytest.fixture
def board(fake_fs: FakeKernelCgroupFs, tmp_path: Path) -> Board:
    return Board(fake_fs, tmp_path / "run")


def _batch_throttled_and_frozen(board: Board) -> tuple[Plan, Shedder]:
    """npu-chat's shedder after two steps on npu-batch (512 MiB, high 1 GiB): throttle, freeze."""
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    sh = board.shedder(chat)
    sh.shed(CTX)
    board.tick()
    sh.shed(CTX)
    return batch, sh


def _undone(sh: Shedder) -> str:
    """The step of the shedder's next undo."""
    done = sh.undo()
    assert done is not None
    return str(done.after["step"])


def _shed(mon: Monitor) -> Shed:
    """The monitor's shed handler (made for its plan's `shed` rules)."""
    handler = mon.executor.handler("shed")
    assert isinstance(handler, Shed)
    return handler


def _high(fs: FakeKernelCgroupFs, plan: Plan) -> str:
    return fs.read(plan.group, files.MEMORY_HIGH).strip()


def test_the_ladder_throttles_then_freezes_within_yield_and_waits_the_settle_time(
    board: Board,
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 700 * MIB)
    sh = board.shedder(chat)
    res = sh.shed(CTX)
    assert res.ok and res.after["step"] == "throttle" and res.after["victim"] == "npu-batch"
    # memory.high := memory.current (never below memory.min: 700 MiB is above the fake's)
    assert _high(board.fs, batch) == str(700 * MIB)
    assert sh.shed(CTX).detail == "settling after the previous step"
    assert _high(board.fs, chat) == str(MEMORY_HIGH)  # never its own group
    board.tick()
    assert sh.shed(CTX).after["step"] == "freeze"
    assert board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "1"
    board.tick()
    # yield = throttle, freeze: never stopped or killed by a shed
    assert sh.shed(CTX).detail == "nothing left to shed"
    assert sh.totals_list() == [
        {"victim": "npu-batch", "step": "freeze", "count": 1},
        {"victim": "npu-batch", "step": "throttle", "count": 1},
    ]
    held = Journal(board.run / "npu-batch").shed()
    assert held is not None
    assert (held.by, held.state, held.frozen) == ("npu-chat", "frozen", True)
    assert held.memory_high == str(700 * MIB) and held.when == CTX.when
    # one hold: the shedder's own account of the victim is what its journal folds to
    own = sh.held["npu-batch"].hold
    assert (own.by, own.pid, own.steps, own.frozen, own.memory_high, own.when) == (
        held.by, held.pid, held.steps, held.frozen, held.memory_high, held.when,
    )  # fmt: skip
    assert own.state == held.state and held.steps == [ShedStep.THROTTLE, ShedStep.FREEZE]
    # the watchdog knows what to revert should the shedder die
    assert board.reverts[-1] == [
        ("thaw", "-", batch.group),
        ("high", str(BATCH_HIGH), batch.group),
    ]


def test_the_undo_thaws_then_raises_memory_high_in_steps_back_to_the_policy_value(
    board: Board,
) -> None:
    batch, sh = _batch_throttled_and_frozen(board)
    assert sh.undo() is None  # the settle time holds for the undo too
    board.tick()
    assert _undone(sh) == "thaw"
    assert board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "0"
    highs = []
    for _ in range(RAISE_STEPS):
        board.tick()
        assert _undone(sh) == "raise"
        highs.append(int(_high(board.fs, batch)))
    assert highs == sorted(highs) and len(set(highs)) == RAISE_STEPS
    assert highs[-1] == BATCH_HIGH  # the policy's value, in steps
    board.tick()
    assert _undone(sh) == "release"
    assert not sh.holding()
    assert Journal(board.run / "npu-batch").shed() is None
    assert board.reverts[-1] == []
    steps = [e["step"] for e in Journal(board.run / "npu-batch").entries()]
    assert steps == ["throttle", "freeze", "thaw", *["raise"] * RAISE_STEPS, "release"]


def test_a_raise_grows_the_victim_only_into_what_the_board_has(board: Board) -> None:
    """Quiet is not room: a job that wants more than MemAvailable is held until the board
    has it (each raise at most MemAvailable less ROOM_HEADROOM above its usage)."""
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    avail = [ROOM_HEADROOM + 8 * MIB]
    sh = board.shedder(chat, memavailable=lambda: avail[0])
    sh.shed(CTX)
    board.tick()
    assert sh.undo() is None  # 8 MiB of room: less than one raise, held as it is
    assert _high(board.fs, batch) == str(512 * MIB) and sh.holding()
    assert sh.undo() is None  # ... and tried again only a settle time later
    board.tick(0.5)
    assert sh.shed(CTX).after["step"] == "freeze"  # a wait for room holds no step back
    board.tick()
    assert _undone(sh) == "thaw"
    avail[0] = ROOM_HEADROOM + 40 * MIB
    board.tick()
    assert _undone(sh) == "raise"  # by the room, not by a quarter of the way back
    assert _high(board.fs, batch) == str(552 * MIB)
    avail[0] = 4 << 30  # the chat ended: room for the rest
    highs = []
    while sh.holding():
        board.tick()
        if _undone(sh) == "raise":
            highs.append(int(_high(board.fs, batch)))
    assert highs[-1] == BATCH_HIGH and highs == sorted(highs), highs


def test_pressure_that_comes_back_during_the_undo_takes_the_steps_again(board: Board) -> None:
    batch, sh = _batch_throttled_and_frozen(board)
    board.tick()
    assert _undone(sh) == "thaw"
    board.tick()
    assert sh.shed(CTX).after["step"] == "freeze"  # frozen again, not "nothing left"
    board.tick()
    assert _undone(sh) == "thaw"
    board.tick()
    assert _undone(sh) == "raise"
    (board.fs.path(batch.group) / files.MEMORY_CURRENT).write_text(f"{520 * MIB}\n")
    board.tick()
    assert sh.shed(CTX).after["step"] == "throttle"  # at what it uses now
    assert _high(board.fs, batch) == str(520 * MIB)
    sh.release_all("monitor stopped")
    assert _high(board.fs, batch) == str(BATCH_HIGH)


def test_never_an_equal_or_higher_class_lowest_class_and_largest_first(board: Board) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    board.publish(_plan("chat-two", QosSpec(qos_class="interactive")), 900 * MIB)
    board.publish(_plan("std", QosSpec(qos_class="standard")), 950 * MIB)
    board.publish(_plan("bg-small", QosSpec(qos_class="background")), 100 * MIB)
    board.publish(_plan("bg-large", QosSpec(qos_class="background")), 400 * MIB)
    assert [v.name for v in board.shedder(chat).victims()] == ["bg-large", "bg-small", "std"]
    # an interactive policy is no victim of another; a background one sheds nobody
    std = board.shedder(_plan("std", QosSpec(qos_class="standard")))
    assert [v.name for v in std.victims()] == ["bg-large", "bg-small"]
    bg = board.shedder(_plan("bg-large", QosSpec(qos_class="background")))
    assert bg.victims() == [] and bg.shed(CTX).detail == "nothing left to shed"


def test_one_shedder_per_victim_the_second_passes_it_over_until_the_release(
    board: Board,
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    std = board.publish(_plan("std", QosSpec(qos_class="standard")), 300 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    first = board.shedder(chat, pid=1001, alive=lambda pid: pid in (1001, 1002))
    second = board.shedder(std, pid=1002, alive=lambda pid: pid in (1001, 1002))
    assert first.shed(CTX).after["step"] == "throttle"
    # the standard policy's shed would throttle it again and, at its own undo, lift the
    # first one's hold: it passes the batch over
    assert second.shed(CTX).detail == "nothing left to shed"
    assert _high(board.fs, batch) == str(512 * MIB)
    board.tick(3 * SETTLE_S * RAISE_STEPS)
    while first.holding():
        assert first.undo() is not None
        board.tick()
    assert _high(board.fs, batch) == str(BATCH_HIGH)
    res = second.shed(CTX)
    assert res.after["step"] == "throttle" and res.after["victim"] == "npu-batch"
    assert Journal(board.run / "npu-batch").shed().by == "std"  # type: ignore[union-attr]
    # a shedder that died (its watchdog reverted it) holds nothing: the first may take it
    dead = board.shedder(chat, pid=1003, alive=lambda pid: pid == 1003)
    assert dead.shed(CTX).after["step"] == "throttle"


def test_stop_sends_sigterm_and_kill_waits_for_the_grace(board: Board) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    job = board.publish(
        _plan("job", QosSpec(qos_class="background", yields=("stop", "kill"))), 9, launched=True
    )
    board.fs.add_process(job.leaf, 4242)
    sent: list[tuple[int, int]] = []
    sh = board.shedder(chat, kill=lambda pid, sig: sent.append((pid, sig)))
    assert sh.shed(CTX).after["step"] == "stop"
    assert sent == [(4242, signal.SIGTERM)]  # every process of a slice without an engine pid
    board.tick()
    assert "grace" in (sh.shed(CTX).detail or "")
    board.tick(10)
    assert sh.shed(CTX).after["step"] == "kill"
    assert board.fs.read(job.group, files.CGROUP_KILL).strip() == "1"


def test_the_victims_own_monitor_takes_the_shed_as_its_baseline(board: Board) -> None:
    batch, _ = _batch_throttled_and_frozen(board)
    own = Executor(
        Env(
            board.fs,
            batch,
            engine_pids=lambda: [],
            journal=Journal(board.run / "npu-batch"),
            alive=lambda pid: pid == os.getpid(),
        )
    )
    res = own.execute(compile_action(parse_action("set memory.high +50%")), CTX)
    assert res.ok and _high(board.fs, batch) == str(512 * MIB)  # never above the throttle
    own.execute(compile_action(parse_action("set memory.high 900M")), CTX)
    assert _high(board.fs, batch) == str(512 * MIB)
    res = own.execute(compile_action(parse_action("thaw")), CTX)
    assert res.detail == "kept frozen: shed by npu-chat"
    assert board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "1"
    # a shedder that died: its watchdog reverted; nothing holds any more
    assert Journal(board.run / "npu-batch").shed(lambda pid: False) is None
    assert Journal(board.run / "npu-batch").shed(lambda pid: pid == os.getpid()) is not None


def test_the_shed_and_the_victims_own_set_write_memory_high_under_its_journal_lock(
    board: Board, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The throttle's write and its journal entry are one step under the victim's journal
    lock, and so is the victim's read-baseline-write: in the guest the victim's rule once
    lifted a throttle in the 19 ms between the shedder's write and its entry."""
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    inside: list[bool] = [False]
    writes: list[tuple[str, bool]] = []
    real_locked, real_write = Journal.locked, board.fs.write

    @contextlib.contextmanager
    def locked(self: Journal) -> Iterator[None]:
        with real_locked(self):
            inside[0] = True
            try:
                yield
            finally:
                inside[0] = False

    def write(cgroup: str, file: str, value: str) -> None:
        if file == files.MEMORY_HIGH:
            writes.append((cgroup, inside[0]))
        real_write(cgroup, file, value)

    monkeypatch.setattr(Journal, "locked", locked)
    monkeypatch.setattr(board.fs, "write", write)
    board.shedder(chat).shed(CTX)
    own = Executor(
        Env(
            board.fs,
            batch,
            engine_pids=lambda: [],
            journal=Journal(board.run / "npu-batch"),
            alive=lambda pid: pid == os.getpid(),
        )
    )
    own.execute(compile_action(parse_action("set memory.high 256M")), CTX)  # below: it goes
    assert [g for g, _ in writes] == [batch.group, batch.group]
    assert all(locked for _, locked in writes), writes


def test_a_journal_that_cannot_be_locked_stops_neither_the_shed_nor_the_victims_set(
    board: Board, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)

    @contextlib.contextmanager
    def unlockable(self: Journal) -> Iterator[None]:
        raise PermissionError(13, "read-only run dir")
        yield  # pragma: no cover

    monkeypatch.setattr(Journal, "locked", unlockable)
    with Journal(board.run / "npu-batch").try_locked() as failed:
        assert isinstance(failed, PermissionError)
    assert board.shedder(chat).shed(CTX).after["step"] == "throttle"
    assert _high(board.fs, batch) == str(512 * MIB)
    own = Executor(
        Env(
            board.fs,
            batch,
            engine_pids=lambda: [],
            journal=Journal(board.run / "npu-batch"),
            alive=lambda pid: pid == os.getpid(),
        )
    )
    assert own.execute(compile_action(parse_action("set memory.high 256M")), CTX).ok
    assert _high(board.fs, batch) == str(256 * MIB)


def test_board_file_cgroups_are_victims_with_their_class(board: Board) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    board.fs.mkdir("system.slice")
    board.fs.mkdir("system.slice/camera.service")
    (board.fs.path("system.slice/camera.service") / files.MEMORY_HIGH).write_text("max\n")
    (board.fs.path("system.slice/camera.service") / files.MEMORY_CURRENT).write_text("4096\n")
    board.run.mkdir(parents=True, exist_ok=True)
    (board.run / "board.toml").write_text(
        '[[cgroup]]\npath = "system.slice/camera.service"\nclass = "background"\n'
        'yield = ["throttle"]\n'
        '[[cgroup]]\npath = "system.slice/ui.service"\nclass = "interactive"\n'
    )
    sh = board.shedder(chat)
    assert [(v.name, v.governed) for v in sh.victims()] == [("camera", False)]
    assert sh.shed(CTX).after["victim"] == "camera"
    cam = "system.slice/camera.service"
    assert board.fs.read(cam, files.MEMORY_HIGH).strip() == "4096"
    sh.release_all("monitor stopped")  # an ungoverned cgroup gets its value before back
    assert board.fs.read(cam, files.MEMORY_HIGH).strip() == "max"
    assert Journal(board.run / "board" / "camera").shed() is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[[cgroup]]\npath = "/abs"\n', "cgroup[0].path"),
        ('[[cgroup]]\npath = "a/../b"\n', "cgroup[0].path"),
        ('[[cgroup]]\npath = "a"\nclass = "bg"\n', "cgroup[0].class"),
        ('[[cgroup]]\npath = "a"\nyield = ["nap"]\n', "cgroup[0].yield"),
        ('[[cgroup]]\npath = "a"\ncolor = 1\n', "cgroup[0].color"),
        ('[[cgroup]]\npath = "a/x"\n[[cgroup]]\npath = "b/x"\n', "cgroup[1].name"),
        ("name = 3\n", "name"),
    ],
)
def test_a_bad_board_file_is_refused_naming_the_field(
    tmp_path: Path, text: str, field: str
) -> None:
    path = tmp_path / "board.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as err:
        load_board(path)
    assert err.value.exit_code == 65 and err.value.field == field
    assert str(err.value).endswith(f"({path}, {field})")


def test_no_board_file_means_no_ungoverned_cgroups(tmp_path: Path) -> None:
    assert load_board(tmp_path / "absent.toml") == ()


def test_the_monitor_sheds_on_a_board_trigger_and_gives_back_once_quiet(
    board: Board, tmp_path: Path
) -> None:
    rule = watch_rule(
        0,
        WatchCondition(condition="memavailable", threshold=200 * MIB, file="/proc/meminfo"),
        ("shed",),
        cooldown_s=5.0,
        when="board available < 200MiB",
    )
    chat = board.publish(replace(_plan("npu-chat", CHAT), watch=(rule,)), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    proc = tmp_path / "proc"
    mon = board.monitor(chat, proc)

    def second(avail_mib: int) -> None:
        (proc / "meminfo").write_text(f"MemTotal: 2000000 kB\nMemAvailable: {avail_mib << 10} kB\n")
        board.tick(1.0)
        mon.dispatch()

    second(150)
    assert _high(board.fs, batch) == str(512 * MIB)  # throttled at the first firing
    for _ in range(12):
        second(150)  # still low: the rule fires again after its cooldown, the next step
    assert board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "1"
    for _ in range(40):
        second(800)  # quiet for the cooldown: the undo, step by step
    assert board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "0"
    assert _high(board.fs, batch) == str(BATCH_HIGH)
    assert not _shed(mon).shedder.holding()
    steps = {(t["victim"], t["step"]) for t in mon.totals()["shed_totals"]}
    assert ("npu-batch", "release") in steps
    mon.finish()


def test_board_file_below_the_model_sheds_until_the_file_cache_holds_the_model_again(
    board: Board, tmp_path: Path
) -> None:
    # issue 47: lmkd keeps shedding after a thrash until the file cache is back above a floor;
    # a served model's floor is its size. MemAvailable stays high all along (the rule reads
    # the file LRUs of /proc/meminfo, not MemAvailable)
    model = 1024 * MIB
    rule = watch_rule(
        0,
        WatchCondition(condition="board_file", threshold=model, file="/proc/meminfo"),
        ("shed",),
        cooldown_s=5.0,
        when="board file < model",
    )
    chat = board.publish(replace(_plan("npu-chat", CHAT), watch=(rule,)), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    proc = tmp_path / "proc"
    mon = board.monitor(chat, proc)

    def second(file_mib: int) -> None:
        active, inactive = file_mib // 2, file_mib - file_mib // 2
        (proc / "meminfo").write_text(
            f"MemTotal: 2000000 kB\nMemAvailable: {1500 << 10} kB\n"
            f"Active(file): {active << 10} kB\nInactive(file): {inactive << 10} kB\n"
        )
        board.tick(1.0)
        mon.dispatch()

    second(1100)  # the model fits: nothing
    assert _high(board.fs, batch) == str(BATCH_HIGH)
    second(700)  # thrash took the cache below the model: throttled
    assert _high(board.fs, batch) == str(512 * MIB)
    for _ in range(12):
        second(900)  # still below: the shed goes on, the next step
    assert board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "1"
    for _ in range(40):
        second(1100)  # the model is back in the cache: the undo, step by step
    assert board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "0"
    assert _high(board.fs, batch) == str(BATCH_HIGH)
    assert not _shed(mon).shedder.holding()
    mon.finish()


def test_the_headroom_rule_throttles_a_lower_class_before_the_board_is_full(
    board: Board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``board available < headroom`` (issue 36): the chat claims a 1000 MiB peak (its
    estimate, given at launch) and holds 600 MiB; the board (its file's reserve: 300 MiB)
    sheds the batch job as soon as MemAvailable less the reserve is below the 400 MiB the
    chat still needs, with no PSI stall at all, and gives back once the chat has room."""
    (tmp_path / "board.toml").write_text('[board]\nreserve = "300MiB"\n')
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    rule = watch_rule(
        0,
        WatchCondition(condition="headroom", threshold=1800 * MIB, file="/proc/meminfo"),
        ("shed",),
        cooldown_s=5.0,
        when="board available < headroom",
    )
    chat = board.publish(replace(_plan("npu-chat", CHAT), watch=(rule,)), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    proc = tmp_path / "proc"
    proc.mkdir()
    mon = Monitor(
        Env(
            board.fs,
            chat,
            engine_pids=lambda: [],
            board=Readings(ProcFs(proc)),
            clock=lambda: board.now[0],
            journal=Journal(board.run / chat.policy),
            watchdog=board,
        ),
        peak=1000 * MIB,
    ).start()
    assert [r.threshold for r in mon.rules] == [1000 * MIB]  # the estimate, not memory.max

    def second(avail_mib: int) -> None:
        (proc / "meminfo").write_text(f"MemTotal: 2000000 kB\nMemAvailable: {avail_mib << 10} kB\n")
        board.tick(1.0)
        mon.dispatch()

    second(710)  # 710 - 300 = 410 MiB spare >= 400 MiB still needed
    assert _high(board.fs, batch) == str(BATCH_HIGH)
    second(690)  # 390 MiB spare: short of the chat's headroom
    assert _high(board.fs, batch) == str(512 * MIB)  # throttled at its memory.current
    (board.fs.path(chat.group) / files.MEMORY_CURRENT).write_text(f"{900 * MIB}\n")
    for _ in range(40):
        second(690)  # the chat grew to 900 MiB: 100 MiB more is all it needs
    assert _high(board.fs, batch) == str(BATCH_HIGH)
    assert not _shed(mon).shedder.holding()
    mon.finish()


def test_the_watchdog_reverts_a_dead_shedders_holds(tmp_path: Path) -> None:
    """EOF on the pipe (the governor died, even by SIGKILL): the /bin/sh watchdog thaws the
    victims and writes memory.high back, from the latest list it was given only."""
    from governor.supervise.watchdog import fork_watchdog

    root = tmp_path / "cg"
    for cg, high in (("slice/a", "1000"), ("slice/b", "2000")):
        (root / cg).mkdir(parents=True)
        (root / cg / files.CGROUP_FREEZE).write_text("1\n")
        (root / cg / files.MEMORY_HIGH).write_text(f"{high}\n")
    dog = fork_watchdog()
    dog.arm_shed(str(root), [("thaw", "-", "slice/b"), ("high", "max", "slice/b")])
    dog.arm_shed(str(root), [("thaw", "-", "slice/a"), ("high", "4096", "slice/a")])
    assert dog.fd is not None
    os.close(dog.fd)  # what the kernel does when the governor dies
    dog.fd = None
    _, status = os.waitpid(dog.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (root / "slice/a" / files.CGROUP_FREEZE).read_text().strip() == "0"
    assert (root / "slice/a" / files.MEMORY_HIGH).read_text().strip() == "4096"
    # replaced by the second list: b was released meanwhile, nothing of it is touched
    assert (root / "slice/b" / files.CGROUP_FREEZE).read_text().strip() == "1"
    assert (root / "slice/b" / files.MEMORY_HIGH).read_text().strip() == "2000"


class Stalls:
    """The kernel's stall counters: the board's (the root's memory.pressure), the shedding
    group's and the victim's; each second adds what the test says."""

    def __init__(self, fs: FakeKernelCgroupFs, *groups: str) -> None:
        self.fs = fs
        self.totals = {g: 0 for g in ("", *groups)}
        self.write()

    def write(self) -> None:
        for group, total in self.totals.items():
            line = f"avg10=0.00 avg60=0.00 avg300=0.00 total={total}"
            (self.fs.path(group) / files.MEMORY_PRESSURE).write_text(f"some {line}\nfull {line}\n")

    def add(self, board_ms: int, **by_group_ms: int) -> None:
        self.totals[""] += board_ms * 1000
        for group, ms in by_group_ms.items():
            self.totals[group] += ms * 1000
        self.write()


def test_a_board_trigger_set_off_by_the_held_victims_own_stall_neither_escalates_nor_blocks_the_undo(
    board: Board, tmp_path: Path
) -> None:
    """Throttled at memory.high, the victim stalls in its own reclaim, which the board's
    pressure counts: that firing is not counted (no freeze, the undo goes on); pressure
    outside the victim, or the shedder's own, still is."""
    trigger = WatchTrigger(
        resource="memory", kind="some", stall_us=100_000, window_us=1_000_000,
        file=files.MEMORY_PRESSURE, system=True,
    )  # fmt: skip
    rule = watch_rule(0, trigger, ("shed",), cooldown_s=4.0, when="board memory some 100ms/1s")
    chat = board.publish(replace(_plan("npu-chat", CHAT), watch=(rule,)), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    stalls = Stalls(board.fs, chat.group, batch.group)
    proc = tmp_path / "proc"
    mon = board.monitor(chat, proc)

    def frozen() -> bool:
        return board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "1"

    def second(board_ms: int, **by_group_ms: int) -> None:
        stalls.add(board_ms, **by_group_ms)
        board.tick(1.0)
        mon.dispatch()

    second(0)
    second(300)  # stall outside the victims: the shed throttles the batch
    assert _high(board.fs, batch) == str(512 * MIB)
    for _ in range(40):  # the board's stall is the batch's own, at its throttle
        if not _shed(mon).shedder.holding():
            break
        second(300, **{batch.group: 300})
        assert not frozen()
    # quiet for the cooldown: the undo raised memory.high back and released the batch
    assert _high(board.fs, batch) == str(BATCH_HIGH)
    assert not _shed(mon).shedder.holding()
    assert _shed(mon).own_stall.discounted > 0
    # outside pressure again: throttle, then freeze, although the batch stalls as well
    for _ in range(14):
        second(400, **{batch.group: 300})
    assert frozen()
    # the same with the stall inside the shedder's own group, overlapping the batch's
    for _ in range(30):
        second(0)
    assert not frozen() and not _shed(mon).shedder.holding()
    for _ in range(14):
        second(300, **{batch.group: 300, chat.group: 300})
    assert frozen()
    mon.finish()


def test_board_available_counts_the_page_cache_memory_min_protects_as_taken(
    board: Board, tmp_path: Path
) -> None:
    """MemAvailable counts the chat's model as reclaimable; memory.min keeps it resident. With
    450 MiB of it protected, MemAvailable 500 MiB is 50 MiB the board can give: `board
    available < 200M` fires, `memavailable < 200M` (the kernel's figure) does not."""
    floor = 200 * MIB
    rules = (
        watch_rule(0, WatchCondition(condition="available", threshold=floor, file="/proc/meminfo"),
                   ("shed",), cooldown_s=5.0),
        watch_rule(1, WatchCondition(condition="memavailable", threshold=floor,
                                     file="/proc/meminfo"), ("log",), cooldown_s=5.0),
    )  # fmt: skip
    chat = board.publish(replace(_plan("npu-chat", CHAT), watch=rules), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    group = board.fs.path(chat.group)
    (group / files.MEMORY_MIN).write_text(f"{600 * MIB}\n")
    (group / "memory.stat").write_text(f"anon {150 * MIB}\nfile {450 * MIB}\n")
    proc = tmp_path / "proc"
    mon = board.monitor(chat, proc)
    (proc / "meminfo").write_text(f"MemTotal: 2000000 kB\nMemAvailable: {500 << 10} kB\n")
    board.tick(1.0)
    mon.dispatch()
    assert _high(board.fs, batch) == str(512 * MIB)  # throttled: 500 - 450 < 200 MiB
    assert [(f["rule"], f["value"]) for f in mon.firings] == [(0, 50 * MIB)], mon.firings
    # the protection covers only part of the cache: that part alone is taken off
    (group / files.MEMORY_MIN).write_text(f"{200 * MIB}\n")
    assert mon.board.available(board.fs, chat.group) == 300 * MIB


def test_stop_never_signals_a_published_engine_pid_outside_the_victims_cgroup(
    board: Board,
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    job = board.publish(
        _plan("job", QosSpec(qos_class="background", yields=("stop",))), 9, launched=True
    )
    board.fs.add_process(job.leaf, 4242)
    path = board.run / "job" / "state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "engine_pid": 1}))  # stale or forged: pid 1 is not its
    sent: list[tuple[int, int]] = []
    sh = board.shedder(chat, kill=lambda pid, sig: sent.append((pid, sig)))
    assert sh.shed(CTX).after["step"] == "stop"
    assert sent == [(4242, signal.SIGTERM)]  # the cgroup's own process, never pid 1

    path.write_text(json.dumps({**state, "engine_pid": 4242}))  # its engine, in its cgroup
    sent.clear()
    board.fs.add_process(job.leaf, 4243)  # the engine's child: the engine passes it on
    again = board.shedder(chat, kill=lambda pid, sig: sent.append((pid, sig)))
    assert again.shed(CTX).after["step"] == "stop"
    assert sent == [(4242, signal.SIGTERM)]


def test_the_kill_step_sigkills_every_pid_where_the_kernel_has_no_cgroup_kill(
    board: Board,
) -> None:
    """Linux < 5.14 (a board's 5.10): the shed's `kill` is the monitor's fallback, the group
    frozen and each pid SIGKILLed, not a cgroup.kill write that fails at every firing."""
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    job = board.publish(
        _plan("job", QosSpec(qos_class="background", yields=("kill",))), 9, launched=True
    )
    board.fs.add_process(job.leaf, 4242)
    (board.fs.path(job.group) / files.CGROUP_KILL).unlink()
    sent: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        if sig == signal.SIGKILL:
            board.fs.reap(pid)

    sh = board.shedder(chat, kill=kill)
    res = sh.shed(CTX)
    assert res.ok and res.after["step"] == "kill", res
    assert sent == [(4242, signal.SIGKILL)]
    assert board.fs.procs(job.leaf) == []


def test_the_ladder_never_stops_a_victim_whose_claim_stays_after_a_stop(
    board: Board, tmp_path: Path
) -> None:
    """Issue 44 item 3: an `apply` slice keeps its state and memory.min once its processes
    are stopped, so the ladder throttles it as before but never takes its stop or kill."""
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    job = board.publish(
        _plan("job", QosSpec(qos_class="background", yields=("throttle", "stop", "kill"))), 9
    )
    board.fs.add_process(job.leaf, 4242)
    sent: list[tuple[int, int]] = []
    sh = board.shedder(chat, kill=lambda pid, sig: sent.append((pid, sig)))
    assert sh.shed(CTX).after["step"] == "throttle"
    board.now[0] += 100
    res = sh.shed(CTX)
    assert res.detail == "nothing left to shed"
    assert sent == []
