"""Fixtures for tests on fake cgroup trees (tmp directories, no mocks of open)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .fakekernel import FakeKernelCgroupFs, make_root


@pytest.fixture
def cgroup_root(tmp_path: Path) -> Path:
    """A fresh fake cgroup2 root offering cpuset cpu io memory pids, nothing enabled."""
    return make_root(tmp_path / "cgroup")


@pytest.fixture
def fake_fs(cgroup_root: Path) -> FakeKernelCgroupFs:
    return FakeKernelCgroupFs(cgroup_root)
