"""Runtime state (governor/rundir/state.py) and `governor status` (governor/operate/status.py).

Fake cgroup trees for the policy-vs-kernel comparison; the host's real cgroup2 (no memory
controller on this kind of machine) for a live launch, its state, and the stale state a
SIGKILLed supervisor leaves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice

from governor.api import host as api_host
from governor.errors import PolicyNotFound
from governor.kernel.leafname import leaf_name
from governor.operate.status import collect, render
from governor.plan.model import Plan
from governor.rundir.state import Publisher, RunState, check_state, prune_stale, read_states

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
SCHEMA = json.loads((REPO / "docs" / "status.schema.json").read_text())

POLICY = """name = "st"
[memory]
high = "1G"
max = "1536M"
[[pressure]]
when = "memory some 150ms/2s"
do = ["log", "reclaim 64M"]
cooldown = "5s"
"""


def _tree_plan(tmp_path: Path) -> tuple[Plan, Path]:
    cg = tmp_path / "cg"
    shutil.copytree(HOSTS / "rk3588" / "sys" / "fs" / "cgroup", cg)
    policy = tmp_path / "st.toml"
    policy.write_text(POLICY)
    plan = api_host.check(policy, api_host.HostOptions(root=HOSTS / "rk3588", cgroup_root=cg))
    group = cg / plan.group
    group.mkdir(parents=True)
    for w in plan.writes:
        (group / w.file).write_text(w.value + "\n")
    return plan, group


def _required_keys(item: dict[str, object]) -> None:
    assert set(SCHEMA["items"]["required"]) <= set(item), "status JSON lost a documented field"


def test_knobs_say_in_sync_drifted_or_missing_against_the_kernel(tmp_path: Path) -> None:
    plan, group = _tree_plan(tmp_path)
    (group / "memory.max").write_text("1073741824\n")  # an operator's echo behind our back
    (group / "memory.oom.group").unlink(missing_ok=True)
    run = tmp_path / "run"
    Publisher(run, plan.policy).publish(
        {"policy": plan.policy, "source": "apply", "pid": None, "plan": plan.to_dict()}
    )
    (item,) = collect(run, "st")
    _required_keys(item)
    states = {k["file"]: k["state"] for k in item["knobs"]}
    assert states["memory.high"] == "in sync"
    assert states["memory.max"] == "drifted"
    assert item["state"] == "running"
    drifted = next(k for k in item["knobs"] if k["file"] == "memory.max")
    assert (drifted["policy"], drifted["kernel"]) == (str(plan.limit("memory.max")), "1073741824")
    assert "drifted" in render([item])


def test_an_unknown_name_is_66_and_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(PolicyNotFound) as info:
        collect(tmp_path / "run", "nope")
    assert info.value.exit_code == 66
    assert str(info.value) == f"no governed slice named nope ({tmp_path / 'run'})"


def test_a_state_whose_pid_is_not_a_governor_is_stale(tmp_path: Path) -> None:
    plan, _group = _tree_plan(tmp_path)
    run = tmp_path / "run"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        for name, pid in (("alive-not-governor", sleeper.pid), ("dead", 2**22 + 1)):
            Publisher(run, name).publish(
                {"policy": name, "source": "launch", "pid": pid, "plan": plan.to_dict()}
            )
        states = {s.policy: s.stale for s in read_states(run)}
    finally:
        sleeper.kill()
        sleeper.wait()
    assert states == {"alive-not-governor": True, "dead": True}


def test_status_prune_removes_only_stale_states_and_keeps_their_journal(
    tmp_path: Path,
) -> None:
    plan, _group = _tree_plan(tmp_path)
    run = tmp_path / "run"
    for name, pid in (("gone", 2**22 + 1), ("live", os.getpid())):
        Publisher(run, name).publish(
            {"policy": name, "source": "launch", "pid": pid, "plan": plan.to_dict()}
        )
    (run / "gone" / "journal.jsonl").write_text("{}\n")
    fake = tmp_path / "proc" / str(os.getpid())  # this test's pid, shown as a governor
    fake.mkdir(parents=True)
    (fake / "cmdline").write_bytes(b"python\0-m\0governor\0launch\0")
    assert prune_stale(run, "live", tmp_path / "proc") == []  # NAME's only: not stale
    assert prune_stale(run, None, tmp_path / "proc") == [("gone", 2**22 + 1)]
    assert not (run / "gone" / "state.json").exists()
    assert (run / "gone" / "journal.jsonl").exists()
    assert [s.policy for s in read_states(run, tmp_path / "proc")] == ["live"]
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run), "PYTHONPATH": str(REPO)}
    Publisher(run, "gone").publish(
        {"policy": "gone", "source": "launch", "pid": 2**22 + 1, "plan": plan.to_dict()}
    )
    cli = subprocess.run(
        [sys.executable, "-m", "governor", "status", "gone", "--prune"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (cli.returncode, cli.stdout) == (0, "no governed slices\n")
    assert cli.stderr == f"pruned gone: its supervisor (pid {2**22 + 1}) is gone\n"
    again = subprocess.run(
        [sys.executable, "-m", "governor", "status", "gone", "--prune"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert again.returncode == 66  # nothing to prune, nothing governed by that name


def test_publisher_removes_its_file_and_directory(tmp_path: Path) -> None:
    pub = Publisher(tmp_path, "x")
    assert pub.publish({"policy": "x"})
    assert json.loads((tmp_path / "x" / "state.json").read_text())["format"] == 1
    pub.remove()
    assert not (tmp_path / "x").exists()


def _governor(run: Path, *argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "governor", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_live_launch_publishes_its_state_and_the_watchdog_removes_a_killed_ones(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    """Real cgroup2 (this host's has PSI but no memory controller): the supervisor's state
    appears while the engine runs, status shows it running with its rules armed, and after
    SIGKILL the watchdog removes the cgroup and the state: nothing stale is left listed."""
    run = tmp_path / "run"
    policy = tmp_path / "live.toml"
    policy.write_text(
        f'name = "live"\nslice = "{scratch_slice.name}"\n'
        '[[pressure]]\nwhen = "memory some 150ms/2s"\ndo = ["log"]\n'
    )
    gov = _governor(
        run, "launch", "--policy", str(policy), "--allow-missing", "memory,cpu,cpuset,io,pids",
        "--", "sleep", "60",
    )  # fmt: skip
    state_file = run / "live" / "state.json"
    try:
        cgroups.wait_for(state_file.exists, timeout=60, what="the published state")
        status = subprocess.run(
            [sys.executable, "-m", "governor", "status", "live", "--json"],
            env={**os.environ, "GOVERNOR_RUN_DIR": str(run), "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            check=True,
        )
        (item,) = json.loads(status.stdout)
        _required_keys(item)
        assert item["state"] == "running" and item["pid"] == gov.pid
        assert item["engine_pid"] and item["cgroup"].endswith(f"{scratch_slice.name}/live")
        assert [(r["rule"], r["state"], r["next_actions"]) for r in item["rules"]] == [
            (0, "armed", ["log"])
        ]
        gov.send_signal(signal.SIGKILL)
        gov.wait(timeout=30)
        group = scratch_slice.path / "live"
        cgroups.wait_for(lambda: not group.exists(), timeout=30, what="the watchdog's cleanup")
        cgroups.wait_for(
            lambda: not state_file.parent.exists(), timeout=30, what="the state's removal"
        )
        assert read_states(run) == []
    finally:
        if gov.poll() is None:
            gov.kill()
            gov.wait()


def test_a_victim_shows_the_shed_that_holds_it_and_its_class(tmp_path: Path) -> None:
    """Issue 23: `status VICTIM` says who sheds it, since when and why, from its journal; the
    hold ends with its shedder's pid (the watchdog reverted it)."""
    from governor.rundir.journal import Journal

    plan, group = _tree_plan(tmp_path)
    run = tmp_path / "run"
    Publisher(run, plan.policy).publish(
        {"policy": plan.policy, "source": "apply", "pid": None, "plan": plan.to_dict()}
    )
    # a live "governor" (its command line says so) as the shedder
    shedder = subprocess.Popen(["governor-shedder", "60"], executable="/bin/sleep")
    # Popen returns (vfork) while the kernel is still inside the exec: /proc/PID/cmdline reads
    # empty until the new program's arguments are in place
    cmdline = Path(f"/proc/{shedder.pid}/cmdline")
    for _ in range(1000):
        if b"governor" in cmdline.read_bytes():
            break
        time.sleep(0.001)
    try:
        (group / "memory.high").write_text("4096\n")  # the throttle
        change = {"cgroup": plan.group, "file": "memory.high", "before": "max", "after": "4096"}
        journal = Journal(run / plan.policy)
        journal.append("shed", [change], by="npu-chat", pid=shedder.pid, step="throttle",
                       when="board memory some 100ms/1s")  # fmt: skip
        (item,) = collect(run, "st")
        _required_keys(item)
        steps = ["unload", "throttle", "freeze", "stop", "kill"]  # the default yield
        assert item["qos"] == {"class": "standard", "yield": steps}
        shed = item["shed"]
        assert set(SCHEMA["items"]["properties"]["shed"]["required"]) <= set(shed)
        assert (shed["by"], shed["state"], shed["memory_high"]) == ("npu-chat", "throttled", "4096")
        text = render([item])
        assert "SHED     throttled by npu-chat since " in text
        assert ": board memory some 100ms/1s (memory.high 4096)" in text
        assert "throttle by npu-chat: memory.high max -> 4096" in text  # the journal line
        assert {k["file"]: k["state"] for k in item["knobs"]}["memory.high"] == "shed"
    finally:
        shedder.kill()
        shedder.wait()
    (item,) = collect(run, "st")
    assert item["shed"] is None and "SHED" not in render([item])
    assert {k["file"]: k["state"] for k in item["knobs"]}["memory.high"] == "drifted"


def test_status_shows_the_slices_claim_and_the_boards_budget(tmp_path: Path) -> None:
    """Issue 36: the figures of `governor board`, in every item (max is st's peak claim)."""
    from governor.board.budget import reserve_for
    from governor.kernel.procfs import ProcFs

    plan, _group = _tree_plan(tmp_path)
    run = tmp_path / "run"
    Publisher(run, plan.policy).publish(
        {"policy": plan.policy, "source": "apply", "pid": None, "plan": plan.to_dict()}
    )
    (item,) = collect(run, "st")
    b = item["budget"]
    memtotal = ProcFs().meminfo()["MemTotal"]  # the gatherer reads this host's /proc
    assert (b["memtotal"], b["budget"]) == (memtotal, memtotal - reserve_for(memtotal))
    assert b["claim"] == {"min": 0, "peak": 1536 << 20, "peak_source": "max"}
    assert b["claimed"] == {"min": 0, "peak": 1536 << 20}
    assert b["free"]["peaks"] == b["budget"] - (1536 << 20)
    assert "  claim: min 0B, peak 1.5GiB (max); board budget" in render([item])


def test_a_routers_status_has_a_row_per_model_leaf_and_the_metric_per_model(
    tmp_path: Path,
) -> None:
    """Issue 38: llama-server's router: one row per <group>/models/<alias> (the kernel's
    memory.current, memory.max, oom_kill; the estimate the launch published) and the metric
    governor_model_memory_bytes{policy,model}."""
    from prometheus_client import generate_latest

    from governor.metrics.collector import registry

    plan, group = _tree_plan(tmp_path)
    for alias, current, limit, procs, events in (
        ("small", 300 << 20, "419430400", "4242\n", "oom 0\noom_kill 0\n"),
        ("hog", 4096, "8388608", "", "oom 2\noom_kill 1\n"),
    ):
        leaf = group / "models" / alias
        leaf.mkdir(parents=True)
        (leaf / "memory.current").write_text(f"{current}\n")
        (leaf / "memory.max").write_text(f"{limit}\n")
        (leaf / "cgroup.procs").write_text(procs)
        (leaf / "memory.events").write_text(events)
    run = tmp_path / "run"
    Publisher(run, plan.policy).publish(
        {"policy": plan.policy, "source": "launch", "pid": None, "plan": plan.to_dict(),
         "model": {"router": {"small": 280 << 20, "hog": 40 << 20}},
         "router": {"url": "http://127.0.0.1:8080",
                    "models": {"small": {"last_request": 1000.0, "load_s": 3.5,
                                         "bytes": 290 << 20},
                               "hog": {"last_request": None}},
                    "unloads": [{"model": "hog", "reason": "memory", "count": 2}]}}
    )  # fmt: skip
    (item,) = collect(run, "st", now=1012.5)
    props = SCHEMA["items"]["properties"]["models"]["items"]
    assert all(set(props["required"]) == set(row) for row in item["models"])
    assert item["models"] == [
        {"model": "hog", "leaf": "hog", "loaded": False, "memory_current": 4096, "memory_max": 8 << 20,
         "estimate": 40 << 20, "oom_kill": 1, "last_request": None, "last_request_s": None,
         "load_s": None, "load_bytes": None},
        {"model": "small", "leaf": "small", "loaded": True, "memory_current": 300 << 20,
         "memory_max": 400 << 20, "estimate": 280 << 20, "oom_kill": 0,
         "last_request": 1000.0, "last_request_s": 12.5, "load_s": 3.5, "load_bytes": 290 << 20},
    ]  # fmt: skip
    text = render([item])
    assert (
        "  model    small  loaded  current 300MiB  max 400MiB  estimate 280MiB  oom_kill 0"
        "  last request 12s ago  load 3.5s 290MiB" in text
    )
    assert "  model    hog  unloaded" in text and "oom_kill 1  last request -" in text
    from governor.operate.top import Frame, frame_text

    top = frame_text(Frame().rows([item], 0.0), "memory", 0.0).splitlines()
    slice_row = next(i for i, line in enumerate(top) if line.startswith("st"))
    assert top[slice_row + 1].split()[:3] == ["hog", "4KiB", "8MiB"]
    assert top[slice_row + 2].split()[:3] == ["small", "300MiB", "400MiB"]
    assert top[slice_row + 1].endswith("last request -")
    assert top[slice_row + 2].endswith("last request 12s ago")
    states = [RunState.read(json.loads((run / plan.policy / "state.json").read_text()))]
    metrics = generate_latest(registry(lambda: states, run)).decode()
    assert 'governor_model_memory_bytes{model="small",policy="st"} 3.145728e+08' in metrics
    assert 'governor_model_memory_bytes{model="hog",policy="st"} 4096.0' in metrics
    assert 'governor_model_unloads_total{model="hog",policy="st",reason="memory"} 2.0' in metrics
    # issue 46 item 1: each model's measured load (none measured for hog: no series)
    assert 'governor_model_load_seconds{model="small",policy="st"} 3.5' in metrics
    assert 'governor_model_load_bytes{model="small",policy="st"} 3.0408704e+08' in metrics
    assert 'governor_model_load_seconds{model="hog"' not in metrics


def test_a_model_whose_leaf_name_differs_is_shown_by_its_name_with_its_leaf(
    tmp_path: Path,
) -> None:
    """Issue 43 item 10: the leaf of `org/tiny:Q8_0` is `org%2Ftiny:Q8_0`, that of `memory.max`
    `_memory.max` (kernel/leafname.py); status, status --json and the metric name the model,
    status shows the leaf where it differs, from the mapping the launch published (a cut leaf
    reads back as no model) and, for a state without it, from the mapping read back."""
    from prometheus_client import generate_latest

    from governor.metrics.collector import registry

    plan, group = _tree_plan(tmp_path)
    cut = "x" * 300
    for leaf in ("org%2Ftiny:Q8_0", "_memory.max", "tiny", leaf_name(cut)):
        d = group / "models" / leaf
        d.mkdir(parents=True)
        (d / "memory.current").write_text("4096\n")
        (d / "memory.max").write_text("8388608\n")
        (d / "cgroup.procs").write_text("42\n")
        (d / "memory.events").write_text("oom 0\noom_kill 0\n")
    run = tmp_path / "run"
    published = {"org/tiny:Q8_0": "org%2Ftiny:Q8_0", "tiny": "tiny", cut: leaf_name(cut)}
    Publisher(run, plan.policy).publish(
        {"policy": plan.policy, "source": "launch", "pid": None, "plan": plan.to_dict(),
         "router": {"url": "http://127.0.0.1:8080",
                    "models": {m: {"last_request": None, "leaf": leaf}
                               for m, leaf in published.items()}}}
    )  # fmt: skip
    (item,) = collect(run, "st", now=1000.0)
    assert {row["model"]: row["leaf"] for row in item["models"]} == {
        "org/tiny:Q8_0": "org%2Ftiny:Q8_0",
        "memory.max": "_memory.max",  # not published: the mapping read back
        "tiny": "tiny",
        cut: leaf_name(cut),
    }
    text = render([item])
    assert "  model    org/tiny:Q8_0  leaf org%2Ftiny:Q8_0  loaded  current 4KiB" in text
    assert "  model    memory.max  leaf _memory.max  loaded" in text
    assert "  model    tiny  loaded" in text
    assert f"  model    {cut}  leaf {leaf_name(cut)}  loaded" in text
    states = [RunState.read(json.loads((run / plan.policy / "state.json").read_text()))]
    metrics = generate_latest(registry(lambda: states, run)).decode()
    assert 'governor_model_memory_bytes{model="org/tiny:Q8_0",policy="st"} 4096.0' in metrics
    assert 'governor_model_memory_bytes{model="memory.max",policy="st"} 4096.0' in metrics


def test_a_published_leaf_that_is_no_leaf_makes_the_state_no_state() -> None:
    """The mapping is a peer's file too: a leaf with a '/' or a newline is refused."""

    def state(leaf: object) -> dict[str, Any]:
        router = {"url": "http://127.0.0.1:1", "models": {"m": {"leaf": leaf}}}
        return {"policy": "st", "router": router}

    for leaf in ("../x", "a/b", "a\nb", "x" * 256, 7):
        assert check_state(state(leaf)) is not None, leaf
    assert check_state(state("_memory.max")) is None
    assert check_state(state(None)) is None  # a model with no leaf


def test_journal_lines_of_a_probe_say_the_step_and_why_with_no_empty_change_list() -> None:
    """A probe_generate entry changes no file: status shows its step and why, not
    "probe_generate:  (why)"; an entry with changes and a reason keeps "changes (reason)"."""
    from governor.operate.status import _journal_lines

    now = time.time()
    probe = {"id": 3, "time": now, "source": "probe_generate", "changes": [],
             "reason": "http://127.0.0.1:8080 gave no token", "step": "restart"}  # fmt: skip
    tune = {"id": 4, "time": now, "source": "tune", "reason": "by hand",
            "changes": [{"file": "memory.high", "before": "1G", "after": "900M"}]}  # fmt: skip
    admit = {"id": 5, "time": now, "source": "admit", "changes": [],
             "reason": "admitted after stopping bg (a lower class)"}  # fmt: skip
    lines = _journal_lines({"journal": [probe, tune, admit], "policy": "p"})
    assert lines[2].endswith(" admit: admitted after stopping bg (a lower class)")
    assert lines[0].endswith("probe_generate: restart, http://127.0.0.1:8080 gave no token")
    assert "  " not in lines[0].split(" probe_generate: ")[1]
    assert lines[1].endswith("tune: memory.high 1G -> 900M (by hand)")
