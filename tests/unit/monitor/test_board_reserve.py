"""The monitor's board reserve (``board available < headroom`` reads spare = available less the
reserve): a board file's ``[board] reserve`` that leaves no budget (>= MemTotal: `check` and
admission refuse it, a ``--force`` launch runs beside it) would make every sample "short";
the default reserve holds instead (issue 43 item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.board.budget import reserve_for
from governor.kernel.procfs import ProcFs
from governor.monitor.sources import Board

MEMTOTAL_KB = 2_013_000


def _board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reserve: str | None) -> Board:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(
        f"MemTotal: {MEMTOTAL_KB} kB\nMemFree: 100000 kB\nMemAvailable: 900000 kB\n"
    )
    board = tmp_path / "board.toml"
    if reserve is not None:
        board.write_text(f'[board]\nreserve = "{reserve}"\n')
    monkeypatch.setenv("GOVERNOR_BOARD", str(board))
    return Board(ProcFs(proc))


def test_a_board_files_reserve_holds_when_it_leaves_a_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _board(tmp_path, monkeypatch, "300M").reserve() == 300 << 20


def test_no_board_file_is_the_default_reserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _board(tmp_path, monkeypatch, None).reserve() == reserve_for(MEMTOTAL_KB << 10)


@pytest.mark.parametrize("reserve", ["2G", "10G"])
def test_a_reserve_that_leaves_no_budget_falls_back_to_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reserve: str
) -> None:
    assert _board(tmp_path, monkeypatch, reserve).reserve() == reserve_for(MEMTOTAL_KB << 10)
