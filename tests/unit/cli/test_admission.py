"""Admission against the board's budget (issue 36, item 2) on the host: the command lines'
exit 75 and its one line (`check --engine-argv`, `install`), and governor/api/admit.py's modes
with fixture claims, a fake clock and a fake stop (the real ones run in the kernel guest:
tests/kernel/test_admission_guest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import run

from governor.api.admit import admission, board_lock
from governor.board.budget import GIB, MIB, Budget
from governor.board.scan import Board
from governor.board.slice import QosClass, Slice
from governor.errors import AdmissionRefused
from governor.plan.model import CgroupWrite, Plan, QosSpec
from governor.record import replace

REPO = Path(__file__).resolve().parents[3]
RK3588 = REPO / "tests/fixtures/hosts/rk3588"
GOLDEN = REPO / "tests/golden/plans/base@rk3588.json"
BOARD = Budget.of(2 * GIB)  # budget 1.75 GiB


def policy(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\n{body}')
    return path


def test_install_refuses_guarantees_over_the_budget_with_75_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    root = tmp_path / "dest"
    root.mkdir()
    batch = policy(tmp_path, "npu-batch", '[memory]\nmin = "1.1GiB"\n[qos]\nclass = "background"\n')
    chat = policy(tmp_path, "chat", '[memory]\nmin = "1.1GiB"\n[qos]\nclass = "interactive"\n')
    code, _, err = run(capsys, "--root", str(RK3588), "install", str(batch), "--root", str(root))
    assert code == 0, err
    before = sorted(p for p in root.rglob("*"))
    code, _, err = run(capsys, "--root", str(RK3588), "install", str(chat), "--root", str(root))
    # rk3588's MemTotal 1.92 GiB: 1.67 GiB of budget, 0.57 GiB left beside npu-batch
    assert code == 75, err
    assert err.splitlines()[0] == (
        "governor: the board cannot admit chat: memory.min 1126 MiB, 589 MiB of guarantees"
        " left, 538 MiB short (npu-batch holds 1126 MiB, installed)"
        f" ([qos] admit, {tmp_path}/board.toml)"
    )
    assert err.splitlines()[1].startswith("hint: ")
    assert sorted(p for p in root.rglob("*")) == before  # nothing of chat written
    code, _, err = run(
        capsys, "--root", str(RK3588), "install", str(chat), "--root", str(root), "--force"
    )
    assert code == 0, err
    # a guarantees refusal forced says guarantees (not a peak overlap: issue 43, low)
    (line,) = [x for x in err.splitlines() if x.startswith("governor: admitted by --force: ")]
    assert line == (
        "governor: admitted by --force: chat's memory.min 1126 MiB exceeds the guarantees left"
        " (589 MiB) by 538 MiB (npu-batch holds 1126 MiB, installed): the guarantees"
        " overcommit the board"
    )


def test_check_engine_argv_says_75_beside_a_running_slice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from governor.rundir.state import Publisher, applied

    run_dir = tmp_path / "run"
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run_dir))
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    (tmp_path / "board.toml").write_text('[board]\nreserve = "200MiB"\n')
    held = json.loads(GOLDEN.read_text())
    group = "governor.slice/npu-batch"
    held.update(policy="npu-batch", group=group, leaf=f"{group}/engine")
    held["cgroup_root"] = str(tmp_path / "cg")  # an applied slice holds while its group exists
    (tmp_path / "cg" / group).mkdir(parents=True)
    held["writes"] = [{"cgroup": group, "file": "memory.min", "value": str(GIB),
                       "reason": "memory.min", "controller": "memory"}]  # fmt: skip
    Publisher(run_dir, "npu-batch").publish(
        applied(Plan.from_dict(held), policy_path=None, created=[], started_at=1.0)
    )
    chat = policy(tmp_path, "chat", '[memory]\nmin = "800M"\n')
    code, _, err = run(
        capsys, "--root", str(RK3588), "check", str(chat), "--engine-argv", "/bin/sleep 1"
    )
    assert code == 75, err
    assert err.splitlines()[0] == (
        "governor: the board cannot admit chat: memory.min 800 MiB, 742 MiB of guarantees"
        f" left, 58 MiB short (npu-batch holds 1024 MiB) ([qos] admit, {tmp_path}/board.toml)"
    )
    chat.write_text('name = "chat"\n[memory]\nmin = "500M"\n')
    code, _, err = run(
        capsys, "--root", str(RK3588), "check", str(chat), "--engine-argv", "/bin/sleep 1"
    )
    assert code == 0, err


# ------------------------------------------------------------------ the modes, one by one


def plan(admit: str, cls: str = "interactive", timeout_s: float = 5.0) -> Plan:
    """chat: memory.min 800 MiB, memory.max 1 GiB."""
    p = Plan.from_json(GOLDEN.read_text())
    group = "governor.slice/chat"
    writes = tuple(
        CgroupWrite(group, f, str(v), f, "memory")
        for f, v in (("memory.min", 800 * MIB), ("memory.max", GIB))
    )
    return replace(
        p, policy="chat", group=group, leaf=f"{group}/engine", writes=writes,
        qos=QosSpec(qos_class=cls, admit=admit, admit_timeout_s=timeout_s),  # type: ignore[arg-type]
    )  # fmt: skip


def other(name: str, cls: str, mn: int, peak: int) -> Slice:
    return Slice(name=name, cgroup=f"governor.slice/{name}", qos=QosClass(cls), min=mn, peak=peak,
                 peak_source="max")  # fmt: skip


class FakeBoard:
    """Claims that change as the fake clock moves; what the fake stop stopped."""

    def __init__(self, *claims: Slice) -> None:
        self.claims = list(claims)
        self.now = 0.0
        self.stopped: list[str] = []
        self.gone_at: dict[str, float] = {}

    def gather(self) -> Board:
        live = [c for c in self.claims if self.gone_at.get(c.name, 1e9) > self.now]
        return Board(budget=BOARD, slices=tuple(live))

    def stop(self, _plan: Plan, victim: Slice) -> None:
        self.stopped.append(victim.name)
        self.gone_at[victim.name] = self.now + 2.0  # its engine exits 2 s after the SIGTERM

    def sleep(self, s: float) -> None:
        self.now += s

    def kw(self, tmp_path: Path) -> dict[str, Any]:
        return {"run": tmp_path, "gather": self.gather, "stop": self.stop,
                "clock": lambda: self.now, "sleep": self.sleep}  # fmt: skip


def test_refuse_and_warn_refuse_guarantees_and_nothing_is_stopped(tmp_path: Path) -> None:
    for mode in ("warn", "refuse"):
        b = FakeBoard(other("npu-batch", "background", 1100 * MIB, 1100 * MIB))
        with pytest.raises(AdmissionRefused) as err:
            admission(plan(mode), **b.kw(tmp_path))
        assert err.value.exit_code == 75 and b.stopped == [] and b.now == 0
        assert "(npu-batch holds 1100 MiB)" in str(err.value)


def test_warn_admits_an_overlap_of_peaks_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = FakeBoard(other("npu-batch", "background", 100 * MIB, 1400 * MIB))
    got = admission(plan("warn"), **b.kw(tmp_path))
    assert got.verdict is not None and got.verdict.kind == "peaks" and got.lock_fd is not None
    got.release()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("governor: admitted with an overlap: chat's peak")
    assert line.endswith("chat would shed npu-batch")
    with pytest.raises(AdmissionRefused):
        admission(plan("refuse"), **b.kw(tmp_path))


def test_wait_admits_as_soon_as_the_holder_is_gone_and_refuses_at_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = FakeBoard(other("npu-batch", "standard", 1100 * MIB, 1100 * MIB))
    b.gone_at["npu-batch"] = 3.0
    got = admission(plan("wait"), **b.kw(tmp_path))
    got.release()
    assert b.now == 3.0 and b.stopped == [] and got.note == "admitted after waiting for room"
    assert "waiting up to 5s" in capsys.readouterr().err
    b = FakeBoard(other("npu-batch", "standard", 1100 * MIB, 1100 * MIB))
    with pytest.raises(AdmissionRefused) as err:
        admission(plan("wait"), **b.kw(tmp_path))
    assert b.now == 5.0 and str(err.value).endswith(
        f"(npu-batch holds 1100 MiB), after 5s of wait ([qos] admit, {_board()})"
    )


def test_shed_stops_a_lower_class_only_and_admits_once_it_is_gone(tmp_path: Path) -> None:
    b = FakeBoard(
        other("peer", "interactive", 300 * MIB, 300 * MIB),
        other("npu-batch", "background", 900 * MIB, 900 * MIB),
    )
    got = admission(plan("shed"), **b.kw(tmp_path))
    got.release()
    assert b.stopped == ["npu-batch"] and b.now == 2.0
    assert got.note == "admitted after stopping npu-batch (a lower class)"
    # an equal class holds it: never shed, refused at once
    b = FakeBoard(other("peer", "interactive", 1100 * MIB, 1100 * MIB))
    with pytest.raises(AdmissionRefused) as err:
        admission(plan("shed"), **b.kw(tmp_path))
    assert b.stopped == [] and "no lower class to shed frees enough" in str(err.value)
    # `check` (no act) says the same refusal, not "will shed for room"
    said: list[str] = []
    with pytest.raises(AdmissionRefused) as checked:
        admission(plan("shed"), **b.kw(tmp_path), act=False, say=said.append)
    assert checked.value.exit_code == 75 and str(checked.value) == str(err.value) and said == []


def test_force_admits_guarantees_over_the_budget_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = FakeBoard(other("npu-batch", "background", 1100 * MIB, 1100 * MIB))
    admission(plan("refuse"), force=True, **b.kw(tmp_path)).release()
    assert capsys.readouterr().err.startswith("governor: admitted by --force: ")


def _board() -> str:
    from governor.board.file import board_path

    return str(board_path())


_HOLDER = """
import sys, time
from pathlib import Path
from governor.api.admit import board_lock
fd = board_lock(Path(sys.argv[1]), deadline=time.monotonic())
print("held", flush=True)
sys.stdin.readline()
"""


def test_the_board_lock_is_one_holder_at_a_time_and_not_inherited_by_a_fork(
    tmp_path: Path,
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(AdmissionRefused, match=f"board.lock held by pid {holder.pid} "):
            board_lock(tmp_path, deadline=0.0)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    fd = board_lock(tmp_path, deadline=0.0)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a watchdog forked while the lock is held: it lives on and holds nothing
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    try:
        os.close(fd)  # released by this close although the child still has the descriptor
        os.close(board_lock(tmp_path, deadline=0.0))
    finally:
        os.close(w)
        os.waitpid(pid, 0)
        os.close(r)


# ------------------------------------------------------------------ issue 43


def test_shed_refuses_at_once_when_the_only_victims_claim_stays_after_a_stop(
    tmp_path: Path,
) -> None:
    """Item 5: an applied lower-class slice (no supervisor: its state and memory.min stay) is
    never SIGTERMed for nothing; 75 at once, naming why."""
    for why in ("apply", "launch --keep", "governor monitor"):
        held = replace(other("npu-batch", "background", 1100 * MIB, 1100 * MIB), stays=why)
        b = FakeBoard(held)
        with pytest.raises(AdmissionRefused) as err:
            admission(plan("shed"), **b.kw(tmp_path))
        assert err.value.exit_code == 75 and b.stopped == [] and b.now == 0
        assert (
            f"no lower class to shed frees enough; npu-batch's claim stays after a stop ({why})"
            in str(err.value)
        )
        with pytest.raises(AdmissionRefused) as checked:  # `check` refuses alike
            admission(plan("shed"), **b.kw(tmp_path), act=False)
        assert str(checked.value) == str(err.value)
    # a victim whose stop frees its claim, beside a kept one: only it is stopped
    b = FakeBoard(
        replace(other("applied", "background", 300 * MIB, 300 * MIB), stays="apply"),
        other("job", "background", 900 * MIB, 900 * MIB),
    )
    admission(plan("shed"), **b.kw(tmp_path)).release()
    assert b.stopped == ["job"]


def test_a_reserve_that_leaves_no_budget_refuses_with_65_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 8: not "no holder", not a wait for room that never comes."""
    from governor.errors import PolicyError

    zero = Budget.of(2 * GIB, reserve=2 * GIB)
    for mode in ("warn", "wait", "shed"):
        b = FakeBoard()
        b.gather = lambda: Board(budget=zero, slices=())  # type: ignore[method-assign]
        with pytest.raises(PolicyError) as err:
            admission(plan(mode), board=tmp_path / "board.toml", **b.kw(tmp_path))
        assert err.value.exit_code == 65 and b.now == 0
        assert str(err.value) == (
            "the reserve (2048 MiB) leaves no budget on this board (MemTotal 2048 MiB)"
            f" ([board] reserve, {tmp_path}/board.toml)"
        )
        assert "[board] reserve" in (err.value.hint or "")
    b.gather = lambda: Board(budget=zero, slices=())  # type: ignore[method-assign]
    admission(plan("refuse"), force=True, **b.kw(tmp_path)).release()
    assert "admitted by --force: the reserve (2048 MiB)" in capsys.readouterr().err


def test_wait_says_its_timeout_as_the_policy_spells_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Low item: admit_timeout = "1us" printed 1e-06s."""
    b = FakeBoard(other("npu-batch", "standard", 1100 * MIB, 1100 * MIB))
    with pytest.raises(AdmissionRefused) as err:
        admission(plan("wait", timeout_s=1e-6), **b.kw(tmp_path))
    assert "waiting up to 1us for" in capsys.readouterr().err
    assert ", after 1us of wait (" in str(err.value)
    b = FakeBoard(other("npu-batch", "standard", 1100 * MIB, 1100 * MIB))
    with pytest.raises(AdmissionRefused) as err:
        admission(plan("wait", timeout_s=90.0), **b.kw(tmp_path))
    assert ", after 90s of wait (" in str(err.value)


@pytest.mark.parametrize(
    ("holder", "why"),
    [
        (replace(other("npu-batch", "standard", 1100 * MIB, 1100 * MIB), stays="apply"), "apply"),
        (replace(other("npu-batch", "standard", 1100 * MIB, 1100 * MIB), state="installed"), ""),
        (replace(other("cam", "standard", 1100 * MIB, 1100 * MIB), governed=False), "board"),
    ],
    ids=["its claim stays after a stop", "installed", "a board file's cgroup"],
)
def test_wait_refuses_at_once_when_no_slice_that_can_end_frees_enough(
    tmp_path: Path, holder: Slice, why: str
) -> None:
    """Issue 46 item 4: the guarantees are held by claims that outlive any stop: the room a
    wait waits for never comes, so 75 now, not after admit_timeout of polling."""
    b = FakeBoard(holder)
    with pytest.raises(AdmissionRefused) as err:
        admission(plan("wait"), **b.kw(tmp_path))
    assert err.value.exit_code == 75 and b.now == 0 and b.stopped == []
    assert ", and no wait can make room: no slice whose stop frees its claim holds enough" in str(
        err.value
    )
    # beside a slice that may end, it waits as before (and admits once it is gone)
    running = other("peer", "standard", 600 * MIB, 600 * MIB)
    b = FakeBoard(replace(holder, min=500 * MIB, peak=500 * MIB), running)
    b.gone_at["peer"] = 1.0
    admission(plan("wait"), **b.kw(tmp_path)).release()
    assert b.now == 1.0


def test_check_refuses_a_second_rkllm_instance_whose_npu_memory_does_not_fit_with_75(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45 item 6, end to end: `check --engine-argv` of an RKLLM policy beside a running
    RKLLM instance goes through admission's NPU wiring (governor/api/admit.py admission ->
    npu_admission -> board/npu.py): the memory budget has room, the NPU's 4 GiB domain has not:
    75, one line naming the instance that holds it; the same policy fits once it is gone."""
    from ..init.test_rkllm import running_rkllm

    run_dir = running_rkllm(tmp_path, "npu-a", 3 * GIB)  # holds while its group exists
    group = "governor.slice/npu-a"
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run_dir))
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    model = tmp_path / "m.rkllm"
    model.write_bytes(b"w")
    npu = policy(tmp_path, "npu-b", '[engine]\nkind = "rkllm"\n[device]\nmemory = "1200MiB"\n')
    argv = ("--root", str(RK3588), "check", str(npu), "--engine-argv", f"llm_demo {model} 64 512")
    code, _, err = run(capsys, *argv)
    assert code == 75, err
    assert err.splitlines()[0].startswith(
        "governor: npu-b needs 1200 MiB of NPU memory beside the running RKLLM instance(s)"
        " (npu-a 3072 MiB): 4272 MiB is above the NPU's 4 GiB address space"
    ), err
    assert err.splitlines()[1].startswith("hint: stop the other RKLLM engine first")
    npu.write_text('name = "npu-b"\n[engine]\nkind = "rkllm"\n[device]\nmemory = "512MiB"\n')
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    (tmp_path / "cg" / group).rmdir()  # the first instance is gone: the bigger claim fits
    npu.write_text('name = "npu-b"\n[engine]\nkind = "rkllm"\n[device]\nmemory = "1200MiB"\n')
    code, _, err = run(capsys, *argv)
    assert code == 0, err
