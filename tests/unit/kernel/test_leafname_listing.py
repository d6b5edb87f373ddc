"""The one listing of the router's model leaves (governor/kernel/leafname.py): every leaf
under ``<group>/models`` with its name, sorted, none without ``models/``; a leaf holds its
model loaded while a process is in it, and one that went away meanwhile is neither.

Needs: a tmp directory (a plain tree standing in for cgroupfs)."""

from __future__ import annotations

from pathlib import Path

from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import holds_process, model_leaves
from governor.operate.observe import model_rows


def _leaves(root: Path, **procs: str) -> CgroupFs:
    for leaf, pids in procs.items():
        (root / "g" / "models" / leaf).mkdir(parents=True)
        (root / "g" / "models" / leaf / "cgroup.procs").write_text(pids)
    (root / "g" / "models" / "cgroup.procs").write_text("")  # a file beside the leaves
    return CgroupFs(root)


def test_every_leaf_sorted_with_its_name_and_none_without_models(tmp_path: Path) -> None:
    fs = _leaves(tmp_path, **{"b": "", "a": "12\n", "_memory.max": ""})
    assert model_leaves(fs, "g") == [
        ("g/models/_memory.max", "_memory.max"),
        ("g/models/a", "a"),
        ("g/models/b", "b"),
    ]
    assert model_leaves(fs, "other") == []


def test_a_leaf_is_loaded_while_a_process_is_in_it(tmp_path: Path) -> None:
    fs = _leaves(tmp_path, a="12\n", b="")
    assert holds_process(fs, "g/models/a") is True
    assert holds_process(fs, "g/models/b") is False
    assert holds_process(fs, "g/models/gone") is None


def test_the_live_boards_rows_come_from_the_listing_without_a_leaf_gone_meanwhile(
    tmp_path: Path,
) -> None:
    fs = _leaves(tmp_path, a="12\n", b="")
    (tmp_path / "g" / "models" / "a" / "memory.current").write_text("4096\n")
    (tmp_path / "g" / "models" / "c").mkdir()  # no cgroup.procs: went away while listed
    rows = model_rows(fs, "g", names={"b": "the-b"})
    assert [(r["model"], r["leaf"], r["loaded"], r["memory_current"]) for r in rows] == [
        ("a", "a", True, 4096),
        ("the-b", "b", False, None),
    ]
