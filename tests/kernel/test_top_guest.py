"""`governor top` in a real terminal (tmux send-keys / capture-pane) on a real cgroup v2 kernel:
the running slice's row, sorting keys, q to quit; and the batch frames for scripts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice

ALL = ("memory", "cpu", "cpuset", "io", "pids")
REPO = Path(__file__).resolve().parents[2]


def _tmux(*args: str) -> str:
    return subprocess.run(
        ["tmux", *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout


def _screen(session: str) -> str:
    return _tmux("capture-pane", "-p", "-t", session)


@pytest.mark.kernel(controllers=ALL, root=True)
def test_top_shows_the_slice_sorts_on_keys_and_quits_on_q(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    assert shutil.which("tmux"), "tmux is installed by scripts/setup --tests"
    run = tmp_path / "run"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    policy = tmp_path / "tp.toml"
    policy.write_text(
        f'name = "tp"\nslice = "{scratch_slice.name}"\n[memory]\nhigh = "200M"\nmax = "300M"\n'
    )
    gov = subprocess.Popen(
        [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", "sleep", "600"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    session = f"gtop-{os.getpid()}"
    try:
        cgroups.wait_for((run / "tp" / "state.json").exists, timeout=240, what="the state")
        batch = subprocess.run(
            [sys.executable, "-m", "governor", "top", "-b", "-n", "2", "-d", "0.5"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=True,
        )  # fmt: skip
        frames = [f for f in batch.stdout.split("governor top - ") if f.strip()]
        assert len(frames) == 2, batch.stdout
        row = next(ln for ln in frames[1].splitlines() if ln.startswith("tp "))
        assert "200MiB" in row and "300MiB" in row, row
        command = f"GOVERNOR_RUN_DIR={run} {sys.executable} -m governor top -d 0.5"
        _tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "30", "-c", str(REPO), command)
        cgroups.wait_for(
            lambda: "sorted by memory" in _screen(session) and "tp " in _screen(session),
            timeout=240,
            what="top's first frame in tmux",
        )
        _tmux("send-keys", "-t", session, "p")
        cgroups.wait_for(
            lambda: "sorted by pressure" in _screen(session), timeout=60, what="the p key"
        )
        _tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            alive = subprocess.run(["tmux", "has-session", "-t", session], check=False)
            if alive.returncode != 0:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("q did not end top")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False, capture_output=True)
        gov.terminate()
        gov.wait(timeout=60)
