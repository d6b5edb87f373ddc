"""Kernel tier (runs inside the kernel test guest: scripts/test --tier kernel).

Every test collected from this directory carries the `kernel` marker (a bare marker when the
test declares none: all of memory cpu cpuset io pids, root and PSI), so the host tier's
`-m "not kernel and ..."` never runs them and the requirement check guards them everywhere.
The fixtures (cgroup2_root, scratch_slice, empty_root_subtree, enabled_root_subtree, spawn)
live in tests/conftest.py, shared with the systemd tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents and item.get_closest_marker("kernel") is None:
            item.add_marker(pytest.mark.kernel)
