"""`governor launch` while another process holds the board lock (issue 43 item 2, e2e on the
host's cgroup2): under ``admit = "wait"``, ``admit_timeout = "1s"`` it exits 75 within its
deadline (plus a margin that only says "did not hang"), naming the holder's pid and command
line, and applies nothing. Before, a blocking lockf waited for the holder without end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import Governor

_HOLDER = """
import sys, time
from pathlib import Path
from governor.api.admit import board_lock
fd = board_lock(Path(sys.argv[1]), deadline=time.monotonic())
print("held", flush=True)
sys.stdin.readline()
"""


@pytest.mark.timeout(120)
def test_launch_exits_75_naming_the_board_locks_holder_at_its_admit_timeout(
    governor: Governor,
) -> None:
    run = Path(os.environ["GOVERNOR_RUN_DIR"])
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(run)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=governor.env(),
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        policy = governor.policy('[qos]\nadmit = "wait"\nadmit_timeout = "1s"\n')
        start = time.monotonic()
        got = governor.run(policy, ["/bin/sleep", "30"])
        took = time.monotonic() - start
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    lines = [x for x in got.stderr.splitlines() if x.startswith("governor: ")]
    assert got.code == 75, got.stderr
    assert lines[-1].startswith(f"governor: board.lock held by pid {holder.pid} ({sys.executable}")
    assert lines[-1].endswith(f"for 1s: the board cannot admit rt now ({run}/board.lock)")
    assert took < 60.0  # 1 s of wait, a compile and Python's start: not the holder's lifetime
    assert not governor.group.exists()  # nothing applied
