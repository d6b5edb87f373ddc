"""`governor tune`, `rollback` and `diff` on a running engine, real cgroup v2 kernel (kernel tier):
applied and read back, a refused unsafe tune leaves everything as it was and the engine alive,
--dry-run changes nothing, diff says drift after a tune and in sync after rollback --all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice

ALL = ("memory", "cpu", "cpuset", "io", "pids")
REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parents[1] / "helpers"
MIB = 1 << 20


def _gov(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "governor", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
        check=False,
    )


@pytest.mark.kernel(controllers=ALL, root=True)
def test_tune_applies_guards_dry_runs_journals_and_rolls_back(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    policy = tmp_path / "tn.toml"
    policy.write_text(
        f'name = "tn"\nslice = "{scratch_slice.name}"\n'
        + textwrap.dedent(
            """
            [memory]
            high = "400M"
            max = "512M"
            [cpu]
            weight = 100
            """
        )
    )
    ready = tmp_path / "ready"
    # an engine holding ~120 MiB of anonymous memory
    engine = [
        sys.executable,
        "-c",
        "import pathlib, time; b = bytearray(120 << 20); b[::4096] = b'x' * len(b[::4096]);"
        f" pathlib.Path({str(ready)!r}).write_text('x'); time.sleep(600)",
    ]
    gov = subprocess.Popen(
        [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *engine],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    group = scratch_slice.path / "tn"
    try:
        cgroups.wait_for(ready.exists, timeout=240, what="the engine to hold its memory")
        cgroups.wait_for((run / "tn" / "state.json").exists, timeout=60, what="the state")
        high0 = cgroups.read(group / "memory.high")
        # dry run: prints kernel -> new, changes nothing
        dry = _gov(env, "tune", "tn", "memory.high=300M", "cpu.weight=300", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert f"memory.high: {high0} -> {300 * MIB}" in dry.stdout
        assert cgroups.read(group / "memory.high") == high0
        assert cgroups.read(group / "cpu.weight") == "100"
        # applied and read back, journaled
        done = _gov(env, "tune", "tn", "memory.high=300M", "cpu.weight=300")
        assert done.returncode == 0, done.stderr
        assert cgroups.read(group / "memory.high") == str(300 * MIB)
        assert cgroups.read(group / "cpu.weight") == "300"
        journal = [json.loads(ln) for ln in (run / "tn" / "journal.jsonl").read_text().splitlines()]
        assert journal[-1]["source"] == "tune"
        # unsafe: memory.max below what the engine uses -> 65, nothing changed, engine alive
        max0 = cgroups.read(group / "memory.max")
        unsafe = _gov(env, "tune", "tn", "memory.max=64M", "memory.high=48M")
        assert unsafe.returncode == 65, unsafe.stderr
        assert "memory.current" in unsafe.stderr
        assert cgroups.read(group / "memory.max") == max0
        assert cgroups.read(group / "memory.high") == str(300 * MIB)
        assert gov.poll() is None, "the engine's governor died"
        # a bad key is 65 naming it
        bad = _gov(env, "tune", "tn", "memory.oom_kill_disable=1")
        assert bad.returncode == 65 and "memory.oom_kill_disable" in bad.stderr
        # diff: drift while tuned, in sync after rollback --all
        drift = _gov(env, "diff", str(policy))
        assert drift.returncode == 1, drift.stdout + drift.stderr
        assert "memory.high" in drift.stdout
        back = _gov(env, "rollback", "tn", "--all")
        assert back.returncode == 0, back.stderr
        assert cgroups.read(group / "memory.high") == high0
        assert cgroups.read(group / "cpu.weight") == "100"
        again = _gov(env, "diff", str(policy))
        assert again.returncode == 0, again.stdout + again.stderr
        status = _gov(env, "status", "tn", "--json")
        (item,) = json.loads(status.stdout)
        assert [e["source"] for e in item["journal"]][-2:] == ["tune", "rollback"]
    finally:
        gov.terminate()
        gov.wait(timeout=120)
