"""The one atomic write (governor/atomic.py) that the run-dir state, the clock ledger, the plan
and GGUF caches, install, the tune drop-in and `init -o` use: the target is the old file or the
new one, its mode is the one asked for whatever the umask, and no temp file is left behind,
also when the write fails.

Needs: a tmp directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from governor.atomic import write_atomic


def _left(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_replaces_the_file_whole_with_the_mode_asked_for(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    old = os.umask(0o077)
    try:
        write_atomic(target, "new", 0o644)
        write_atomic(tmp_path / "entry", b"\x00bytes", 0o600, durable=True)
    finally:
        os.umask(old)
    assert target.read_text() == "new" and (tmp_path / "entry").read_bytes() == b"\x00bytes"
    assert target.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "entry").stat().st_mode & 0o777 == 0o600
    assert _left(tmp_path) == ["entry", "state.json"]


def test_a_failed_rename_leaves_the_target_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "x").write_text("")  # a non-empty directory: rename(2) refuses it
    with pytest.raises(OSError):
        write_atomic(target, "data")
    assert _left(tmp_path) == ["taken"] and _left(target) == ["x"]


def test_exclusive_never_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "policy.toml"
    write_atomic(target, "first", exclusive=True)
    with pytest.raises(FileExistsError):
        write_atomic(target, "second", exclusive=True)
    assert target.read_text() == "first" and _left(tmp_path) == ["policy.toml"]
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "no" / "such", "x")
