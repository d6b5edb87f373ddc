"""The board lock against a deadline (issue 43 item 2): while another process holds
``board.lock``, an admission (and `governor check --engine-argv` through the real command line)
exits 75 within its deadline, naming the holder's pid and command line; a board.lock that is a
symlink or a FIFO is refused (69), never followed. The holder is a real process: a POSIX lock
is per process. `governor launch` against a held lock: tests/runtime/test_board_lock.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.api.admit import CHECK_LOCK_WAIT_S, LOCK_WAIT_S, POLL_S, admission, lock_wait
from governor.board.budget import GIB, Budget
from governor.board.scan import Board
from governor.cli.app import main
from governor.errors import AdmissionRefused, HostError

from .test_admission import plan

REPO = Path(__file__).resolve().parents[3]
RK3588 = REPO / "tests/fixtures/hosts/rk3588"

_HOLDER = """
import sys, time
from pathlib import Path
from governor.api.admit import board_lock
fd = board_lock(Path(sys.argv[1]), deadline=time.monotonic())
print("held", flush=True)
sys.stdin.readline()
"""


def _hold(run: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(run)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    return child


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``tmp_path/run/board.lock`` until the test ends."""
    child = _hold(tmp_path / "run")
    yield child
    assert child.stdin is not None
    child.stdin.close()
    child.wait(timeout=30)


def _empty() -> Board:
    return Board(budget=Budget.of(2 * GIB), slices=())


@pytest.mark.timeout(30)
def test_an_admission_gives_up_at_its_admit_timeout_naming_the_holder(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    start = time.monotonic()
    with pytest.raises(AdmissionRefused) as err:
        admission(plan("wait", timeout_s=1.0), run=tmp_path / "run", gather=_empty)
    took = time.monotonic() - start
    assert 1.0 <= took < 10.0  # the deadline, plus a margin that only says "did not hang"
    assert err.value.exit_code == 75
    assert str(err.value).startswith(f"board.lock held by pid {holder.pid} ({sys.executable} -c ")
    assert str(err.value).endswith(
        f"s: the board cannot admit chat now ({tmp_path}/run/board.lock)"
    )
    assert err.value.hint is not None and "^Z" in err.value.hint


def test_the_lock_waits_admit_timeout_under_wait_and_shed_else_a_short_default() -> None:
    assert lock_wait(plan("wait", timeout_s=30.0)) == 30.0
    assert lock_wait(plan("shed", timeout_s=0.5)) == 0.5
    assert lock_wait(plan("refuse", timeout_s=30.0)) == LOCK_WAIT_S == 10.0
    assert lock_wait(plan("warn")) == LOCK_WAIT_S
    assert lock_wait(plan("wait", timeout_s=30.0), check=True) == CHECK_LOCK_WAIT_S
    assert lock_wait(plan("wait", timeout_s=1.0), check=True) == 1.0


def test_a_refusing_admission_waits_the_default_on_its_clock_then_75(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(AdmissionRefused, match=f"held by pid {holder.pid} .* for 10s"):
        admission(
            plan("refuse"), run=tmp_path / "run", gather=_empty, clock=lambda: now[0], sleep=sleep
        )
    assert now[0] == pytest.approx(LOCK_WAIT_S)


def test_the_wait_loop_retakes_the_lock_against_the_same_deadline(tmp_path: Path) -> None:
    """admit = "wait": the lock is let go while it polls for room; a process that takes it
    meanwhile and keeps it makes the admission refuse at the wait's deadline, not hang."""
    from governor.board.budget import MIB

    from .test_admission import other

    run = tmp_path / "run"
    now = [0.0]
    child: list[subprocess.Popen[str]] = []

    def sleep(s: float) -> None:
        if not child:  # the first poll: another process takes the lock and keeps it
            child.append(_hold(run))
        now[0] += s

    full = Board(
        budget=Budget.of(2 * GIB), slices=(other("npu-batch", "standard", 1100 * MIB, GIB),)
    )
    try:
        with pytest.raises(AdmissionRefused) as err:
            admission(
                plan("wait", timeout_s=5.0), run=run, gather=lambda: full,
                clock=lambda: now[0], sleep=sleep, say=lambda _l: None,
            )  # fmt: skip
        assert f"held by pid {child[0].pid} (" in str(err.value)
        assert now[0] == pytest.approx(5.0)
    finally:
        for c in child:
            assert c.stdin is not None
            c.stdin.close()
            c.wait(timeout=30)


def test_a_symlinked_or_fifo_board_lock_is_refused_with_69_not_followed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "etc-passwd-stand-in"
    (run / "board.lock").symlink_to(target)
    with pytest.raises(HostError) as err:
        admission(plan("refuse"), run=run, gather=_empty)
    assert str(err.value) == f"the board lock is a symlink (not followed) ({run}/board.lock)"
    assert err.value.exit_code == 69 and not target.exists()
    (run / "board.lock").unlink()
    os.mkfifo(run / "board.lock")
    with pytest.raises(HostError, match="the board lock is a FIFO, not a file"):
        admission(plan("refuse"), run=run, gather=_empty)


@pytest.mark.timeout(60)
def test_check_engine_argv_exits_75_naming_the_holder_within_its_short_wait(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    holder: subprocess.Popen[str],
) -> None:
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    chat = tmp_path / "chat.toml"
    chat.write_text('name = "chat"\n[memory]\nmin = "100M"\n[qos]\nadmit = "wait"\n')
    start = time.monotonic()
    with pytest.raises(SystemExit) as info:
        main(["--root", str(RK3588), "check", str(chat), "--engine-argv", "/bin/sleep 1"])
    took = time.monotonic() - start
    err = capsys.readouterr().err.splitlines()
    assert info.value.code == 75, err
    assert err[0].startswith(f"governor: board.lock held by pid {holder.pid} (")
    assert err[0].endswith(f"for 2s: the board cannot admit chat now ({tmp_path}/run/board.lock)")
    assert err[1].startswith("hint: another launch, install or check holds it")
    assert took < 20.0  # 2 s of wait (admit_timeout 60 s is the launch's, not check's)


@pytest.mark.timeout(60)
def test_the_lock_and_the_room_share_one_admit_timeout(tmp_path: Path) -> None:
    """A lock released late leaves only what is left of admit_timeout to wait for room: the
    refusal comes at admit_timeout from the start, not admit_timeout after the lock (the
    first cut of the lock's deadline waited up to twice it). The clock is fake: the holder
    lets go when it passes 0.8 s of the 1 s."""
    from .test_admission import other

    child = _hold(tmp_path / "run")
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
        if now[0] >= 0.8 and child.poll() is None:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)

    full = Board(budget=Budget.of(2 * GIB), slices=(other("bg", "interactive", 2 * GIB, 2 * GIB),))
    try:
        with pytest.raises(AdmissionRefused, match=r"after 1s of wait"):
            admission(
                plan("wait", timeout_s=1.0), run=tmp_path / "run", gather=lambda: full,
                clock=lambda: now[0], sleep=sleep, say=lambda _: None,
            )  # fmt: skip
    finally:
        if child.poll() is None:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)
    assert 0.8 <= now[0] < 1.0 + POLL_S  # one poll for room past the lock, not a second wait
