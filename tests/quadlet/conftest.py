"""quadlet tier (scripts/test --tier quadlet, tests/vm/quadlet.py): Debian 13's root file system
with systemd as PID 1 and Debian's podman, in a qemu guest on Debian 13's own 6.12 kernel.

Every test collected from this directory carries the `quadlet` marker, so the host tier never
runs them (harness.HOST_MARKEXPR) and only that guest does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents and item.get_closest_marker("quadlet") is None:
            item.add_marker(pytest.mark.quadlet)
