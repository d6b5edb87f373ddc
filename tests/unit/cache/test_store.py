"""The cache directory's trust rules (governor/cache/store.py) on tmp trees: root reads and writes
entries only where no other user could have put them (owner euid or root, no group/other write
bit, no symlink for the directory or the entry).

Needs: root for the tests that chown a file to another uid (65534, nobody); they fail under
CI=true when not root, and skip otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vm import requirements

from governor.cache.store import cache_dir, read_entry, trusted_dir, write_entry

NOBODY = 65534


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        requirements.enforce(["needs root (euid 0) to chown a file to another uid"])


def _dir(tmp_path: Path, mode: int = 0o700) -> Path:
    d = tmp_path / "plans"
    d.mkdir()
    d.chmod(mode)
    return d


def test_write_then_read_round_trips_with_private_modes(tmp_path: Path) -> None:
    d = tmp_path / "new" / "plans"
    assert write_entry(d, "e.json", b"data")
    assert read_entry(d, "e.json") == b"data"
    assert d.stat().st_mode & 0o777 == 0o700
    assert (d / "e.json").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in d.iterdir()] == ["e.json"]  # no temp file left


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o720, 0o702])
def test_a_group_or_world_writable_directory_is_neither_read_nor_written(
    tmp_path: Path, mode: int
) -> None:
    d = _dir(tmp_path)
    assert write_entry(d, "e.json", b"data")
    d.chmod(mode)
    assert not trusted_dir(d)
    assert read_entry(d, "e.json") is None
    assert not write_entry(d, "other.json", b"x")
    assert sorted(p.name for p in d.iterdir()) == ["e.json"]


def test_a_directory_owned_by_another_user_is_neither_read_nor_written(
    tmp_path: Path, as_root: None
) -> None:
    d = _dir(tmp_path)
    assert write_entry(d, "e.json", b"data")
    os.chown(d, NOBODY, NOBODY)
    assert read_entry(d, "e.json") is None
    assert not write_entry(d, "other.json", b"x")
    assert sorted(p.name for p in d.iterdir()) == ["e.json"]


def test_an_entry_owned_by_another_user_is_not_read(tmp_path: Path, as_root: None) -> None:
    d = _dir(tmp_path)
    assert write_entry(d, "e.json", b"data")
    os.chown(d / "e.json", NOBODY, NOBODY)
    assert read_entry(d, "e.json") is None


def test_a_group_writable_entry_is_not_read(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    assert write_entry(d, "e.json", b"data")
    (d / "e.json").chmod(0o620)
    assert read_entry(d, "e.json") is None


def test_an_entry_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    assert write_entry(d, "real.json", b"data")
    (d / "e.json").symlink_to(d / "real.json")
    assert read_entry(d, "real.json") == b"data"
    assert read_entry(d, "e.json") is None


def test_a_directory_that_is_a_symlink_is_not_trusted(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    assert write_entry(d, "e.json", b"data")
    link = tmp_path / "link"
    link.symlink_to(d)
    assert read_entry(link, "e.json") is None
    assert not write_entry(link, "other.json", b"x")


def test_an_entry_that_is_a_directory_is_not_read(tmp_path: Path) -> None:
    d = _dir(tmp_path)
    (d / "e.json").mkdir(mode=0o700)
    assert read_entry(d, "e.json") is None


def test_a_missing_entry_or_directory_reads_as_none(tmp_path: Path) -> None:
    assert read_entry(tmp_path / "absent", "e.json") is None
    assert read_entry(_dir(tmp_path), "e.json") is None


def test_a_directory_that_cannot_be_created_is_not_written(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert not write_entry(tmp_path / "file" / "plans", "e.json", b"x")


def test_governor_cache_dir_wins_over_the_default(tmp_path: Path) -> None:
    assert cache_dir({"GOVERNOR_CACHE_DIR": str(tmp_path)}) == tmp_path


def test_root_without_governor_cache_dir_uses_var_cache(as_root: None) -> None:
    assert cache_dir({"GOVERNOR_CACHE_DIR": ""}) == Path("/var/cache/governor")
