"""The bounded read of a file another process writes (issue 43 item 3): a FIFO, a device, a
symlink where none is followed, a file over its cap and a file that is not UTF-8 are each one
OSError naming the path, read without blocking and without reading past the cap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from governor.peer.files import CappedReadError, read_capped, read_capped_text


def test_a_regular_file_under_its_cap_is_read_whole(tmp_path: Path) -> None:
    f = tmp_path / "state.json"
    f.write_bytes(b"x" * 100)
    assert read_capped(f, 100) == b"x" * 100


def test_a_file_over_its_cap_is_refused_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "state.json"
    f.write_bytes(b"x" * 101)
    with pytest.raises(CappedReadError, match=r"state.json: 101 bytes, over its cap of 100"):
        read_capped(f, 100)


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)  # no writer: a blocking open would hang this test
    with pytest.raises(CappedReadError, match="a FIFO, not a file") as err:
        read_capped(fifo, 1 << 20)
    assert isinstance(err.value, OSError)


def test_a_device_is_refused_not_read_to_memory() -> None:
    with pytest.raises(CappedReadError, match="a device, not a file"):
        read_capped("/dev/zero", 1 << 20)


def test_a_symlink_to_a_fifo_is_refused_as_a_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "fifo")
    with pytest.raises(CappedReadError, match="a FIFO"):
        read_capped(tmp_path / "link", 10)


def test_a_symlink_is_refused_where_none_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"ok")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_capped(tmp_path / "link", 10) == b"ok"
    with pytest.raises(CappedReadError, match="a symlink"):
        read_capped(tmp_path / "link", 10, follow=False)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CappedReadError, match="a directory"):
        read_capped(tmp_path, 10)


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_capped(tmp_path / "absent", 10)


def test_text_that_is_not_utf8_is_one_error_not_a_decode_traceback(tmp_path: Path) -> None:
    f = tmp_path / "preset.ini"
    f.write_bytes(b"[m]\nmodel = caf\xe9.gguf\n")
    with pytest.raises(CappedReadError, match=r"preset.ini: not UTF-8 \(at byte 15\)"):
        read_capped_text(f, 1 << 20)


def test_read_tail_reads_the_last_whole_lines_within_its_cap(tmp_path: Path) -> None:
    from governor.peer.files import read_tail

    f = tmp_path / "journal.jsonl"
    f.write_bytes(b"first line\nsecond\nthird\n")
    assert read_tail(f, 100) == (b"first line\nsecond\nthird\n", 0)
    # the last 10 bytes are "ond\nthird\n": the cut line is dropped, its bytes counted
    assert read_tail(f, 10) == (b"third\n", 18)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(CappedReadError, match="a FIFO, not a file"):
        read_tail(tmp_path / "fifo", 10)
