"""The one guarded read of a limit (governor/kernel/cgroupfs.py CgroupFs.read_limit) that the
live board, the actions' handlers and the board sources use: a number, None for ``max``, and
the caller's ``unreadable`` (None unless given) for a missing file or group, an unreadable
file, or content that is no number.

Needs: a tmp directory (a plain tree standing in for cgroupfs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.monitor.sources import protected_cache


def _fs(root: Path, **values: str) -> CgroupFs:
    (root / "g").mkdir()
    for name, text in values.items():
        (root / "g" / name.replace("_", ".")).write_text(text)
    return CgroupFs(root)


@pytest.mark.parametrize(
    ("text", "want"),
    [("123\n", 123), ("0\n", 0), ("max\n", None), ("garbage\n", -1), ("", -1), ("-5\n", -1)],
)
def test_a_limit_reads_as_a_number_none_for_max_else_unreadable(
    tmp_path: Path, text: str, want: int | None
) -> None:
    fs = _fs(tmp_path, memory_max=text)
    assert fs.read_limit("g", kf.MEMORY_MAX, unreadable=-1) == want
    assert fs.read_limit("g", kf.MEMORY_MAX) == (None if want == -1 else want)


def test_a_missing_file_or_group_is_unreadable_not_an_error(tmp_path: Path) -> None:
    fs = _fs(tmp_path, memory_max="7\n")
    assert fs.read_limit("g", kf.MEMORY_HIGH) is None
    assert fs.read_limit("gone", kf.MEMORY_MAX, unreadable=0) == 0
    assert fs.read_limit("g", "../escape", unreadable=0) == 0  # no file name: refused


def test_an_unreadable_file_is_unreadable(tmp_path: Path) -> None:
    fs = _fs(tmp_path)
    (tmp_path / "g" / kf.MEMORY_MAX).mkdir()  # EISDIR on read
    assert fs.read_limit("g", kf.MEMORY_MAX, unreadable=5) == 5


@pytest.mark.parametrize(
    ("memory_min", "want"), [("4096\n", 4096), ("max\n", 8192), (None, 0), ("junk\n", 0)]
)
def test_protected_cache_is_zero_when_memory_min_cannot_be_read(
    tmp_path: Path, memory_min: str | None, want: int
) -> None:
    """min(memory.min, the group's page cache); ``max`` protects it all, an unreadable
    memory.min none of it (the board's free memory is never overstated)."""
    fs = _fs(tmp_path, memory_stat="anon 1\nfile 8192\n")
    if memory_min is not None:
        (tmp_path / "g" / kf.MEMORY_MIN).write_text(memory_min)
    assert protected_cache(fs, "g") == want
