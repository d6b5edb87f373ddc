"""`governor status` on a real cgroup v2 kernel with the memory controller (kernel tier).

A running engine's published state is read back through `status --json`: every knob in sync,
then drifted after a write behind the governor's back; usage from the kernel's files; a
SIGKILLed supervisor's state is removed by its watchdog with the group (nothing stale is left
listed; `status --prune` for what a watchdog could not remove is a host test)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice

ALL = ("memory", "cpu", "cpuset", "io", "pids")
REPO = Path(__file__).resolve().parents[2]


def _status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "governor", "status", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=env,
        check=False,
    )


def _item(env: dict[str, str], name: str) -> dict[str, Any]:
    res = _status(env, name, "--json")
    assert res.returncode == 0, res.stderr
    (item,) = json.loads(res.stdout)
    return item  # type: ignore[no-any-return]  # one object per slice


@pytest.mark.kernel(controllers=ALL, root=True)
def test_status_of_a_running_engine_shows_knobs_usage_and_nothing_stale_after_sigkill(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    policy = tmp_path / "st.toml"
    policy.write_text(
        f'name = "st"\nslice = "{scratch_slice.name}"\n'
        + textwrap.dedent(
            """
            [memory]
            high = "200M"
            max = "300M"
            [pids]
            max = 64
            [[pressure]]
            when = "memory some 150ms/2s"
            do = ["log"]
            cooldown = "5s"
            """
        )
    )
    gov = subprocess.Popen(
        [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", "sleep", "600"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    group = scratch_slice.path / "st"
    try:
        cgroups.wait_for(
            (run / "st" / "state.json").exists, timeout=240, what="the published state"
        )
        item = _item(env, "st")
        assert item["state"] == "running" and item["pid"] == gov.pid
        knobs = {k["file"]: k for k in item["knobs"]}
        assert knobs["memory.high"]["state"] == "in sync"
        assert knobs["memory.max"]["kernel"] == str(300 << 20)
        assert knobs["pids.max"]["state"] == "in sync"
        usage = item["usage"]
        assert usage["memory"]["current"] is not None and usage["pids"]["current"] >= 1
        assert usage["pids"]["max"] == 64
        assert set(usage["memory_events"]) >= {"high", "max", "oom_kill"}
        assert item["rules"][0]["state"] == "armed"
        # an operator's write behind the governor's back
        (group / "memory.high").write_text(str(150 << 20))
        item = _item(env, "st")
        knobs = {k["file"]: k for k in item["knobs"]}
        assert knobs["memory.high"]["state"] == "drifted"
        assert knobs["memory.high"]["kernel"] == str(150 << 20)
        plain = _status(env)
        assert plain.returncode == 0 and "drifted" in plain.stdout, plain.stdout
        gov.send_signal(signal.SIGKILL)
        gov.wait(timeout=60)
        cgroups.wait_for(lambda: not group.exists(), timeout=60, what="the watchdog's cleanup")
        cgroups.wait_for(
            lambda: not (run / "st").exists(), timeout=60, what="the watchdog to remove the state"
        )
        assert _status(env, "st").returncode == 66  # not listed as stale: gone
    finally:
        if gov.poll() is None:
            gov.kill()
            gov.wait()
    missing = _status(env, "nope")
    assert missing.returncode == 66
    assert f"governor: no governed slice named nope ({run})" in missing.stderr


def _gov(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "governor", *args],
        capture_output=True, text=True, timeout=240, cwd=REPO, env=env, check=False,
    )  # fmt: skip


@pytest.mark.kernel(controllers=ALL, root=True)
def test_a_monitor_attached_to_an_applied_slice_is_a_supervisor_status_and_tune_see(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    """apply, then monitor: status shows the monitor (pid, rules) while it runs, tune works on
    it and is journaled, a second monitor is refused; SIGTERM hands the state back to apply's,
    and remove still takes away what apply created. The monitor's start is waited for on its
    state file: a `status` call a poll cost ~5 s of the test's 58 (issue 47 item 3)."""
    run = tmp_path / "run"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    policy = tmp_path / "am.toml"
    policy.write_text(
        f'name = "am"\nslice = "{scratch_slice.name}"\n'
        '[memory]\nhigh = "200M"\nmax = "300M"\n'
        '[[pressure]]\nwhen = "oom_kill"\ndo = ["log"]\n'
    )
    applied = _gov(env, "apply", str(policy))
    assert applied.returncode == 0, applied.stderr
    group = scratch_slice.path / "am"
    assert _item(env, "am")["source"] == "apply"
    mon = subprocess.Popen(
        [sys.executable, "-m", "governor", "monitor", str(policy), "--sample-interval", "0.5"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def published() -> bool:  # the file, not `status` (~5 s a call under TCG) in a loop
            try:
                data = json.loads((run / "am" / "state.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                return False
            return bool(data.get("source") == "monitor" and data.get("pid") == mon.pid)

        cgroups.wait_for(published, timeout=240, what="the monitor's state")
        item = _item(env, "am")  # what status makes of it
        assert (item["source"], item["state"], item["pid"]) == ("monitor", "running", mon.pid)
        assert [r["when"] for r in item["rules"]] == ["oom_kill"]
        tuned = _gov(env, "tune", "am", "memory.high=150M")
        assert tuned.returncode == 0, tuned.stderr
        assert cgroups.read(group / "memory.high") == str(150 << 20)
        knob = next(k for k in _item(env, "am")["knobs"] if k["file"] == "memory.high")
        assert knob["state"] == "tuned", knob
        second = _gov(env, "monitor", str(policy), "--duration", "1")
        assert second.returncode == 69, second.stderr
        assert f"governed already by governor pid {mon.pid}" in second.stderr
    finally:
        mon.send_signal(signal.SIGTERM)
        _, err = mon.communicate(timeout=120)
    assert mon.returncode == 0, err
    assert _item(env, "am")["source"] == "apply"
    removed = _gov(env, "remove", str(policy))
    assert removed.returncode == 0, removed.stderr
    assert not group.exists()
    assert _gov(env, "status", "am").returncode == 66
