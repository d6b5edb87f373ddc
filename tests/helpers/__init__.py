"""Workload programs for the real-kernel tiers, run as subprocesses (``python hog.py ...``).

Import this package for their paths and for `argv()`, which builds a command line with the
current interpreter.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOG = HERE / "hog.py"
PAGECACHE = HERE / "pagecache.py"
BURN = HERE / "burn.py"


def argv(script: Path, *args: object) -> list[str]:
    """[python, -u, script, *args] with the running interpreter (the venv's)."""
    return [sys.executable, "-u", str(script), *(str(a) for a in args)]
