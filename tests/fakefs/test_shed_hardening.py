"""The shed against hostile input (issue 35, items 1, 3, 7, 8, 13, 15) on a fake cgroup tree:
a board entry that is, contains or lies inside a governed slice, or has a '.' component, is
skipped with `shed.board_invalid` (once) and hides no other victim; a published state with an
unknown class or step never crashes the shedder nor becomes a kill; a step that fails moves on;
the shedder's own process cgroup, its ancestors and descendants are never victims; the
throttle's memory.min floor and the operator's tune over the undo."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from governor.errors import PermissionDenied
from governor.kernel import files
from governor.log import capture_logs
from governor.monitor.actions.shedder import RAISE_STEPS, Held
from governor.plan.model import QosSpec
from governor.record import replace
from governor.rundir.journal import Journal
from governor.rundir.state import Publisher, applied

from .fakekernel import FakeKernelCgroupFs
from .test_shed import BATCH, BATCH_HIGH, CHAT, CTX, MIB, Board, _high, _plan, _undone

CAM = "system.slice/camera.service"


@pytest.fixture
def board(fake_fs: FakeKernelCgroupFs, tmp_path: Path) -> Board:
    return Board(fake_fs, tmp_path / "run")


def _cgroup(fs: FakeKernelCgroupFs, path: str, usage: int = 64 * MIB) -> None:
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        fs.mkdir("/".join(parts[:i]))
    (fs.path(path) / files.MEMORY_HIGH).write_text("max\n")
    (fs.path(path) / files.MEMORY_CURRENT).write_text(f"{usage}\n")


def _board_file(board: Board, *entries: str) -> None:
    """[[cgroup]] tables: each a path, class background, yield all four."""
    board.run.mkdir(parents=True, exist_ok=True)
    text = "".join(
        f'[[cgroup]]\npath = "{p}"\nclass = "background"\nname = "e{i}"\n'
        for i, p in enumerate(entries)
    )
    (board.run / "board.toml").write_text(text)


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


@pytest.mark.parametrize(
    "path",
    [
        "governor.slice",  # contains every governed slice
        "governor.slice/npu-batch",  # is one
        "governor.slice/npu-batch/engine",  # lies inside one
        "apps.slice",  # contains a governed slice outside governor.slice
        "apps.slice/job/engine",
    ],
)
def test_a_board_entry_on_a_governed_slice_is_skipped_and_its_own_yield_wins(
    board: Board, path: str
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    job = _plan("job", QosSpec(qos_class="background", yields=("throttle",)))
    job = replace(job, slice="apps.slice", group="apps.slice/job", leaf="apps.slice/job/engine")
    job = board.here(job)
    _cgroup(board.fs, job.leaf)
    Publisher(board.run, job.policy).publish(
        applied(job, policy_path=None, created=[], started_at=1.0)
    )
    _cgroup(board.fs, CAM)
    _board_file(board, path, CAM)
    sh = board.shedder(chat, own_cgroup="")
    with capture_logs() as logs:
        victims = {v.name: (v.cgroup, v.yields, v.governed) for v in sh.victims()}
        sh.victims()  # read again at every firing: said once
    assert victims == {
        "npu-batch": (batch.group, ("throttle", "freeze"), True),
        "job": (job.group, ("throttle",), True),
        "e1": (CAM, ("throttle", "freeze", "stop", "kill"), False),  # the other entry stays
    }
    bad = _events(logs, "shed.board_invalid")
    assert len(bad) == 1 and "cgroup[0].path" in bad[0]["reason"], bad
    assert "governed slice" in bad[0]["reason"]
    for _ in range(8):  # the whole ladder: nothing the governed slices' yields do not allow
        sh.shed(CTX)
        board.tick(20)
    assert board.fs.read(batch.group, files.CGROUP_KILL).strip() != "1"
    assert board.fs.read(job.group, files.CGROUP_FREEZE).strip() == "0"
    assert not (board.run / "board" / "e0").exists()  # never journaled under the board
    assert [e["step"] for e in Journal(board.run / "npu-batch").entries()] == ["throttle", "freeze"]


@pytest.mark.parametrize("path", ["system.slice/./camera.service", ".", "a/.", "a//b", "a/../b"])
def test_a_board_path_with_a_dot_component_is_skipped_and_the_shed_goes_on(
    board: Board, path: str
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    _cgroup(board.fs, CAM)
    _board_file(board, path, CAM)
    sh = board.shedder(chat, own_cgroup="")
    with capture_logs() as logs:
        assert [v.name for v in sh.victims()] == ["npu-batch", "e1"]
        assert sh.shed(CTX).after["victim"] == "npu-batch"
    assert _high(board.fs, batch) == str(512 * MIB)
    bad = _events(logs, "shed.board_invalid")
    assert len(bad) == 1 and "cgroup[0].path" in bad[0]["reason"], bad


@pytest.mark.parametrize(
    "text",
    ['[[cgroup]]\npath = "a"\n[[cgroup', "\xff\xfe", "cgroup = 3\n", "cgroup = [1]\n"],
)
def test_a_broken_board_file_at_run_time_is_said_once_and_governed_victims_are_still_shed(
    board: Board, text: str
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    board.run.mkdir(parents=True, exist_ok=True)
    (board.run / "board.toml").write_bytes(text.encode("latin-1"))
    sh = board.shedder(chat, own_cgroup="")
    with capture_logs() as logs:
        assert sh.shed(CTX).after["victim"] == "npu-batch"
        board.tick()
        assert sh.shed(CTX).after["step"] == "freeze"
    assert _high(board.fs, batch) == str(512 * MIB)
    assert len(_events(logs, "shed.board_invalid")) == 1, logs


def _state(board: Board, policy: str) -> Path:
    return board.run / policy / "state.json"


def _edit_qos(board: Board, policy: str, **qos: Any) -> None:
    path = _state(board, policy)
    state = json.loads(path.read_text())
    state["plan"]["qos"].update(qos)
    path.write_text(json.dumps(state))


def test_an_unknown_class_in_another_slices_state_is_skipped_never_a_crash(
    board: Board,
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    board.publish(_plan("vip", BATCH), 900 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    _edit_qos(board, "vip", qos_class="platinum")
    sh = board.shedder(chat, own_cgroup="")
    with capture_logs() as logs:
        assert sh.shed(CTX).after["victim"] == "npu-batch"
        board.tick()
        assert sh.shed(CTX).after["victim"] == "npu-batch"
    assert _high(board.fs, batch) == str(512 * MIB)
    said = _events(logs, "shed.victim_invalid")
    assert [(e["victim"], "platinum" in e["reason"]) for e in said] == [("vip", True)]


def test_an_unknown_yield_step_is_skipped_with_one_line_never_a_kill(board: Board) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    job = board.publish(_plan("job", BATCH), 512 * MIB)
    board.fs.add_process(job.leaf, 4242)
    _edit_qos(board, "job", yields=["nap", "throttle", "obliterate"])
    sent: list[tuple[int, int]] = []
    sh = board.shedder(chat, own_cgroup="", kill=lambda pid, sig: sent.append((pid, sig)))
    with capture_logs() as logs:
        steps = []
        for _ in range(5):
            res = sh.shed(CTX)
            steps.append(res.after.get("step") if res.after else res.detail)
            board.tick(20)
    assert steps == ["throttle", *["nothing left to shed"] * 4]
    assert board.fs.read(job.group, files.CGROUP_KILL).strip() != "1" and sent == []
    assert len(_events(logs, "shed.victim_invalid")) == 1


def test_the_ladder_maps_no_unknown_step_to_an_action(board: Board) -> None:
    """Its last branch is `kill` by name: a step it does not know fails, logged."""
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    job = board.publish(_plan("job", BATCH), 512 * MIB)
    sh = board.shedder(chat, own_cgroup="")
    victim = next(v for v in sh.victims() if v.name == "job")
    with capture_logs() as logs:
        res = sh._take(victim, Held(victim), "obliterate", CTX, 0.0)
    assert not res.ok and "unknown shed step" in (res.detail or "")
    assert board.fs.read(job.group, files.CGROUP_KILL).strip() != "1"
    assert board.fs.read(job.group, files.CGROUP_FREEZE).strip() == "0"
    assert [e["step"] for e in _events(logs, "shed.step_failed")] == ["obliterate"]


def test_a_step_that_fails_is_not_retried_the_ladder_moves_on(
    board: Board, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EPERM on memory.high: the freeze follows at once; the next firing neither retries the
    throttle nor sticks: the next victim's step."""
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 700 * MIB)
    small = board.publish(_plan("small", QosSpec(qos_class="background")), 100 * MIB)
    real = board.fs.write
    tries: list[str] = []

    def write(cgroup: str, file: str, value: str) -> None:
        if file == files.MEMORY_HIGH and cgroup == batch.group:
            tries.append(value)
            raise PermissionDenied(
                "write", cgroup=cgroup, file=file, value=value, errno=errno.EPERM
            )
        real(cgroup, file, value)

    monkeypatch.setattr(board.fs, "write", write)
    sh = board.shedder(chat, own_cgroup="")
    with capture_logs() as logs:
        res = sh.shed(CTX)
        assert (res.after["victim"], res.after["step"]) == ("npu-batch", "freeze")
        board.tick()
        res = sh.shed(CTX)
        assert (res.after["victim"], res.after["step"]) == ("small", "throttle")
    assert len(tries) == 1  # the throttle was tried once
    assert _high(board.fs, small) == str(100 * MIB)
    assert [e["step"] for e in _events(logs, "shed.step_failed")] == ["throttle"]
    assert board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "1"
    # quiet: the undo gives everything back and forgets the failure
    for _ in range(3 * RAISE_STEPS):
        board.tick()
        sh.undo()
    assert not sh.holding()
    board.tick()
    assert sh.shed(CTX).after["victim"] == "npu-batch" and len(tries) == 2


@pytest.mark.parametrize(
    "entry",
    [
        "system.slice",  # an ancestor of the shedder's own cgroup
        "system.slice/governor@chat.service",  # its own cgroup
        "system.slice/governor@chat.service/sub",  # a descendant
    ],
)
def test_the_shedders_own_process_cgroup_its_ancestors_and_descendants_are_never_victims(
    board: Board, entry: str
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    own = "system.slice/governor@chat.service"
    _cgroup(board.fs, f"{own}/sub")
    _cgroup(board.fs, CAM)
    _board_file(board, entry, CAM)
    sh = board.shedder(chat, own_cgroup=own)
    assert [v.cgroup for v in sh.victims()] == [CAM]


def test_the_throttle_never_goes_below_the_victims_memory_min(board: Board) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 200 * MIB)
    (board.fs.path(batch.group) / files.MEMORY_MIN).write_text(f"{300 * MIB + 123}\n")
    board.shedder(chat, own_cgroup="").shed(CTX)
    assert _high(board.fs, batch) == str(300 * MIB)  # memory.min, to the page below


def test_an_operators_tune_during_the_shed_wins_over_the_undo(board: Board) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = board.publish(_plan("npu-batch", BATCH, high=BATCH_HIGH), 512 * MIB)
    sh = board.shedder(chat, own_cgroup="")
    assert sh.shed(CTX).after["step"] == "throttle"
    tuned = str(800 * MIB)
    change = {"cgroup": batch.group, "file": files.MEMORY_HIGH, "before": "x", "after": tuned}
    Journal(board.run / "npu-batch").append("tune", [change])
    highs = []
    while sh.holding():
        board.tick()
        if _undone(sh) == "raise":
            highs.append(_high(board.fs, batch))
    assert highs[-1] == tuned  # not the policy's 1 GiB
    # ... and when the monitor stops with the shed held
    sh.shed(CTX)
    sh.release_all("monitor stopped")
    assert _high(board.fs, batch) == tuned
