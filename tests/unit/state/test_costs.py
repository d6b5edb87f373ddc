"""The measured cost per model file (governor/state/costs.py, issue 46 item 1), kept in the
state directory's per-model store (state/store.py): a load that is not what the governor writes
is dropped, a file over its cap or in an untrusted directory is not read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from governor.state.costs import Cost, CostBook
from governor.state.store import FILE, FILE_CAP, MODELS_MAX, parse


def render(costs: dict[str, Cost]) -> bytes:
    """A store holding these loads (what CostBook.record writes, one entry per model)."""
    models = {
        k: {"at": c.at, "load": {"load_s": c.load_s, "bytes": c.bytes, "at": c.at}}
        for k, c in costs.items()
    }
    return json.dumps({"format": 1, "models": models}).encode()


def test_a_cost_round_trips_and_the_file_keeps_the_most_recent_entries(tmp_path: Path) -> None:
    book = CostBook(tmp_path / "cache")
    assert book.read() == {}
    assert book.record("m.gguf|1|2", Cost(load_s=3.25, bytes=42, at=10.0))
    assert book.get("m.gguf|1|2") == Cost(load_s=3.25, bytes=42, at=10.0)
    for i in range(MODELS_MAX + 5):
        book.record(f"k{i}", Cost(load_s=1.0, bytes=i, at=float(i)))
    kept = book.read()
    assert len(kept) == MODELS_MAX
    assert "k0" not in kept and f"k{MODELS_MAX + 4}" in kept  # the oldest recorded go
    assert (tmp_path / "cache" / FILE).stat().st_size < FILE_CAP


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
    models = {"bad": {"at": 1, "load": entry}, "good": {"at": 1, "load": good}}
    kept, note = parse(json.dumps({"format": 1, "models": models}).encode())
    assert kept == {"bad": {"at": 1}, "good": {"at": 1, "load": good}}
    assert note is not None and "'bad'" in note


@pytest.mark.parametrize(
    "raw", [b"", b"\xff", b"[]", b'{"format": 2, "models": {}}', b'{"format": 1, "models": []}']
)
def test_a_file_that_is_no_store_holds_nothing_and_says_so(raw: bytes) -> None:
    kept, note = parse(raw)
    assert kept == {} and note is not None


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
