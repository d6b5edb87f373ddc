"""The scratch cgroup's cleanup (tests/helpers/cgroups.py kill_and_remove) when the cgroup goes
away under it: a governor's watchdog removes the slice it made, and the host tier once reported
that race as a cleanup failure (2026-12-06: ENOENT on the slice's cgroup.events)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import cgroups


def test_a_cgroup_removed_while_the_cleanup_waits_is_no_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = tmp_path / "gtest.slice"
    top.mkdir()

    def gone(_path: Path) -> bool:
        raise FileNotFoundError(2, "No such file or directory", str(top / "cgroup.events"))

    monkeypatch.setattr(cgroups, "populated", gone)
    assert cgroups.kill_and_remove(top, timeout=1.0) == []
    assert not top.exists()
