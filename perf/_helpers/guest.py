"""A benchmark's run in one of the project's guests (tests/vm/run.py), its output streamed to
this terminal: the lines a benchmark tags for the host (its runs, its metadata) are kept, not
echoed, so the host can write the files and plots."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def commit() -> str:
    """HEAD's short hash ("" outside a git checkout)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip


def began() -> dict[str, str]:
    """The commit and UTC date a run begins at: its record says what ran, not where HEAD is
    once an hour of guest time has passed."""
    return {"commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def stream(
    guest: str,
    cmd: Sequence[str],
    *,
    timeout: float,
    cpus: int,
    hide: tuple[str, ...],
    keep: Path | None = None,
) -> tuple[list[str], int]:
    """Run ``cmd`` in ``guest`` ("kernel", "systemd"); print each line that does not start
    with one of ``hide``; return every line (without its newline) and the harness's exit code.
    ``keep``: a file the hidden lines are also written to as they come, so that a report that
    fails afterwards (a plot, a summary) loses no run of a benchmark that took an hour."""
    harness = [sys.executable, "-m", "vm.run", "--guest", guest,
               f"--timeout={timeout}", f"--cpus={cpus}"]  # fmt: skip
    lines: list[str] = []
    with contextlib.ExitStack() as stack:
        kept = stack.enter_context(keep.open("w")) if keep is not None else None
        p = stack.enter_context(subprocess.Popen(
            [*harness, "--", *cmd], cwd=REPO / "tests", stdout=subprocess.PIPE, text=True,
            errors="replace"))  # fmt: skip
        assert p.stdout is not None
        for line in p.stdout:
            bare = line.rstrip("\r\n")
            if not line.startswith(hide):
                print(line, end="", flush=True)
            elif kept is not None:
                kept.write(bare + "\n")
                kept.flush()
            lines.append(bare)
    return lines, p.returncode
