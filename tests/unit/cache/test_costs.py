"""The measured cost per model file (governor/cache/costs.py, issue 46 item 1): a bounded,
validated file of the cache directory; an entry that is not what the governor writes is
dropped, a file over its cap or in an untrusted directory is not read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from governor.cache.costs import (
    FILE,
    FILE_CAP,
    MAX_MODELS,
    Cost,
    CostBook,
    identity,
    parse,
    render,
)


def test_a_cost_round_trips_and_the_file_keeps_the_most_recent_entries(tmp_path: Path) -> None:
    book = CostBook(tmp_path / "cache")
    assert book.read() == {}
    assert book.record("m.gguf|1|2", Cost(load_s=3.25, bytes=42, at=10.0))
    assert book.get("m.gguf|1|2") == Cost(load_s=3.25, bytes=42, at=10.0)
    many = {f"k{i}": Cost(load_s=1.0, bytes=i, at=float(i)) for i in range(MAX_MODELS + 5)}
    kept = parse(render(many))
    assert len(kept) == MAX_MODELS
    assert "k0" not in kept and f"k{MAX_MODELS + 4}" in kept  # the oldest measured go
    assert len(render(many)) < FILE_CAP


@pytest.mark.parametrize(
    "entry",
    [
        {"load_s": -1, "bytes": 1, "at": 1},
        {"load_s": "3", "bytes": 1, "at": 1},
        {"load_s": True, "bytes": 1, "at": 1},
        {"load_s": 1e9, "bytes": 1, "at": 1},
        {"load_s": 1, "bytes": -5, "at": 1},
        {"load_s": 1, "bytes": 1.5, "at": 1},
        {"load_s": 1, "bytes": 1},
        [1, 2, 3],
    ],
)
def test_an_entry_that_is_no_measurement_is_dropped_the_others_kept(entry: object) -> None:
    good = {"load_s": 2, "bytes": 7, "at": 5}
    raw = json.dumps({"format": 1, "models": {"bad": entry, "good": good}}).encode()
    assert parse(raw) == {"good": Cost(load_s=2.0, bytes=7, at=5.0)}


@pytest.mark.parametrize(
    "raw", [b"", b"\xff", b"[]", b'{"format": 2, "models": {}}', b'{"format": 1, "models": []}']
)
def test_a_file_that_is_no_cost_file_holds_nothing(raw: bytes) -> None:
    assert parse(raw) == {}


def test_a_file_over_its_cap_or_in_an_untrusted_directory_is_not_read(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    book = CostBook(directory)
    book.record("k", Cost(load_s=1.0, bytes=1, at=1.0))
    (directory / FILE).write_bytes(render({"k": Cost(1.0, 1, 1.0)}) + b" " * FILE_CAP)
    assert book.read() == {}
    (directory / FILE).write_bytes(render({"k": Cost(1.0, 1, 1.0)}))
    assert book.read() != {}
    os.chmod(directory, 0o777)  # anyone could have written it
    assert book.read() == {}
    assert CostBook(None).read() == {} and not CostBook(None).record("k", Cost(1.0, 1, 1.0))


def test_the_identity_is_the_model_files_name_size_and_mtime(tmp_path: Path) -> None:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"x" * 10)
    os.utime(m, ns=(1, 2_000_000_000))
    assert identity(m) == "m.gguf|10|2000000000"
    m.write_bytes(b"y" * 11)  # another model under the same name
    assert identity(m) != "m.gguf|10|2000000000"
    assert identity(tmp_path / "gone.gguf") is None
