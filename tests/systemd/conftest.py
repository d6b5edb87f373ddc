"""systemd tier (runs inside the qemu guest with systemd as PID 1: scripts/test --tier systemd).

Every test collected from this directory carries the `systemd` marker (bare: systemd >= 252
as PID 1), so the host tier never runs them and the requirement check guards them everywhere.
Cgroup fixtures come from tests/conftest.py; `systemctl show` parsing from tests/helpers/units.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents and item.get_closest_marker("systemd") is None:
            item.add_marker(pytest.mark.systemd)
