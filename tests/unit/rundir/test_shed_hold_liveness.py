"""A shed's hold on a victim names its shedder by pid AND start time (issue 43: liveness is
never a command-line substring where a start time can be had): a step this process journals
under its own pid records its start, and a hold whose shedder's pid now runs something that
started at another time holds nothing (its watchdog reverted the shed when it died)."""

from __future__ import annotations

import os
from pathlib import Path

from governor.rundir.journal import Journal
from governor.rundir.liveness import own_start


def _throttle(journal: Journal, pid: int, **extra: object) -> dict[str, object]:
    change = {
        "cgroup": "governor.slice/bg",
        "file": "memory.high",
        "before": "max",
        "after": "100M",
    }
    return journal.append("shed", [change], by="chat", pid=pid, step="throttle", when="x", **extra)


def test_a_step_journaled_under_this_process_pid_records_its_start(tmp_path: Path) -> None:
    entry = _throttle(Journal(tmp_path / "bg"), os.getpid())
    assert entry["pid_start"] == own_start() is not None


def test_a_step_under_another_pid_records_no_start(tmp_path: Path) -> None:
    assert "pid_start" not in _throttle(Journal(tmp_path / "bg"), 1001)


def test_a_hold_whose_shedder_runs_holds(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "bg")
    _throttle(journal, os.getpid())
    hold = journal.shed(lambda pid: True)  # the command line: pytest's, not a governor's
    assert hold is not None and hold.pid == os.getpid() and hold.pid_start == own_start()


def test_a_hold_whose_pid_was_reused_holds_nothing(tmp_path: Path) -> None:
    """The shedder's pid runs a process that started at another time: another process (its
    command line may even say governor), not the shedder."""
    journal = Journal(tmp_path / "bg")
    start = own_start()
    assert start is not None
    _throttle(journal, os.getpid(), pid_start=start + 1)
    assert journal.shed(lambda pid: True) is None


def test_an_old_hold_without_a_start_falls_back_to_the_pid_alone(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "bg")
    _throttle(journal, 1001)
    assert journal.shed(lambda pid: pid == 1001) is not None
    assert journal.shed(lambda pid: False) is None
