"""Output files (--report, bench --csv/--json): checked BEFORE anything runs, so a typo in a path
is one error line up front, not a lost result after the engine ran."""

from __future__ import annotations

import os
from pathlib import Path

from governor.errors import PermissionDenied, PolicyNotFound, UsageError


def check_writable(path: Path, option: str) -> None:
    """Raise unless ``path`` can be written as a file: not a directory, its directory exists,
    and this user may write there. Nothing is created."""
    if path.is_dir():
        raise UsageError(
            f"{option} {path} is a directory ({option})",
            hint=f"give a file name: {option} {path / 'report.json'}",
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise PolicyNotFound(
            f"{option}: directory {parent} does not exist",
            file=str(path),
            hint=f"mkdir -p {parent}",
        )
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        raise PermissionDenied(
            f"{option}: cannot write",
            file=str(path),
            hint="choose a path this user can write, or run as its owner",
        )
