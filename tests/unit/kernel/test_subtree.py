"""The one subtree walk (governor/kernel/cgroupfs.py CgroupFs.subtree, procs_below) that
remove (parents first, removed in reverse), the kill fallback (every pid until none) and the
shedder's stop (every pid of a victim) use: parents first, siblings sorted; a cgroup that
vanishes meanwhile has nothing below it; any other failure passes when strict and is skipped
otherwise.

Needs: a tmp directory (a plain tree standing in for cgroupfs)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from governor.errors import BackendError, PermissionDenied
from governor.kernel.cgroupfs import CgroupFs


def _tree(root: Path) -> CgroupFs:
    for cg, pids in (
        ("g", "1\n"),
        ("g/b", "2\n3\n"),
        ("g/b/x", "4\n"),
        ("g/a", ""),
        ("g/c", "5\n"),
    ):
        (root / cg).mkdir(parents=True, exist_ok=True)
        (root / cg / "cgroup.procs").write_text(pids)
    return CgroupFs(root)


class _Failing(CgroupFs):
    """Listing ``bad`` fails with ``code`` (a cgroup removed meanwhile: ENOENT)."""

    def __init__(self, root: Path, bad: str, code: int) -> None:
        super().__init__(root)
        self.bad, self.code = bad, code

    def children(self, cgroup: str) -> list[str]:
        if cgroup == self.bad:
            cls = PermissionDenied if self.code == errno.EACCES else BackendError
            raise cls("cannot list cgroup", cgroup=cgroup, errno=self.code)
        return super().children(cgroup)


def test_parents_first_siblings_sorted_and_every_pid(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    assert fs.subtree("g") == ["g", "g/a", "g/b", "g/b/x", "g/c"]
    assert fs.procs_below("g") == [1, 2, 3, 4, 5]
    assert fs.procs_below("g", strict=True) == [1, 2, 3, 4, 5]
    assert fs.subtree("gone") == ["gone"] and fs.procs_below("gone", strict=True) == []


def test_a_cgroup_removed_meanwhile_has_nothing_below_it(tmp_path: Path) -> None:
    _tree(tmp_path)
    fs = _Failing(tmp_path, "g/b", errno.ENOENT)
    assert fs.subtree("g") == ["g", "g/a", "g/b", "g/c"]
    assert fs.procs_below("g", strict=True) == [1, 2, 3, 5]


def test_another_failure_passes_when_strict_and_is_skipped_otherwise(tmp_path: Path) -> None:
    _tree(tmp_path)
    fs = _Failing(tmp_path, "g/b", errno.EACCES)
    with pytest.raises(PermissionDenied):
        fs.subtree("g")
    with pytest.raises(PermissionDenied):
        fs.procs_below("g", strict=True)
    assert fs.procs_below("g") == [1, 2, 3, 5]
