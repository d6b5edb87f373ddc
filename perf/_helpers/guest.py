"""A benchmark's run in one of the project's guests (tests/vm/run.py), its output streamed to
this terminal: the lines a benchmark tags for the host (its runs, its metadata) are kept, not
echoed, so the host can write the files and plots."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def stream(
    guest: str, cmd: Sequence[str], *, timeout: float, cpus: int, hide: tuple[str, ...]
) -> tuple[list[str], int]:
    """Run ``cmd`` in ``guest`` ("kernel", "systemd"); print each line that does not start
    with one of ``hide``; return every line (without its newline) and the harness's exit code."""
    harness = [sys.executable, "-m", "vm.run", "--guest", guest,
               f"--timeout={timeout}", f"--cpus={cpus}"]  # fmt: skip
    lines: list[str] = []
    with subprocess.Popen([*harness, "--", *cmd], cwd=REPO / "tests", stdout=subprocess.PIPE,
                          text=True, errors="replace") as p:  # fmt: skip
        assert p.stdout is not None
        for line in p.stdout:
            if not line.startswith(hide):
                print(line, end="", flush=True)
            lines.append(line.rstrip("\r\n"))
    return lines, p.returncode
