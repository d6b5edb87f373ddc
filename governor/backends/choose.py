"""Which run-time driver applies a launch's plan: ``--backend systemd|cgroupfs|auto``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

BackendName = Literal["systemd", "cgroupfs", "auto"]


def bus_answers() -> bool:
    """pystemd is installed and the manager answers on the system bus."""
    from governor.backends.systemd import bus_answers as answers

    return answers()


def choose(name: BackendName, *, pid1: str, answers: Callable[[], bool] = bus_answers) -> str:
    """``auto``: systemd when PID 1 is systemd and the manager answers on the bus."""
    if name != "auto":
        return name
    return "systemd" if pid1 == "systemd" and answers() else "cgroupfs"
