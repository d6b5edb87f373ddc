"""Admission against the board's budget (issue 36, items 1 and 2) with the real kernel, in the
guest (2 GiB): sleep engines under small policies whose memory.min are a share of the guest's
budget (MemTotal less the default reserve), so the arithmetic and not the engine decides.

- two policies whose memory.min sum passes the budget: the second launch exits 75 with the
  line naming the first, and nothing of it is applied (no group, no state);
- the same policy with ``admit = "wait"`` starts as soon as the first exits;
- ``admit = "shed"``: an interactive launch stops a running background engine (its journal
  says "stop" by the admission) and starts; `status` says why it runs;
- two launches racing for the last room: exactly one starts, the other exits 75 (the board
  lock);
- issue 43: ``admit = "shed"`` beside an `apply`d lower-class slice (its claim stays after a
  stop) exits 75 at once and touches nothing of it; an applied slice whose group was removed
  is stale (`status`), pruned, and claims nothing (a launch that needed its room starts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from helpers import cgroups
from helpers.cgroups import ScratchSlice

from governor.board.budget import Budget, gib, short
from governor.rundir.journal import Journal

REPO = Path(__file__).resolve().parents[2]
SLEEP = ("/bin/sleep", "1000")


def _memtotal() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def _share(share: float) -> int:
    """``share`` of the guest's budget, in MiB."""
    return int(Budget.of(_memtotal()).budget * share) >> 20


def _policy(tmp_path: Path, slice_: ScratchSlice, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nslice = "{slice_.name}"\n' + textwrap.dedent(body))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir(mode=0o755, exist_ok=True)
    return {**os.environ, "GOVERNOR_RUN_DIR": str(run),
            "GOVERNOR_BOARD": str(tmp_path / "board.toml")}  # fmt: skip


def _argv(policy: Path) -> list[str]:
    return [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *SLEEP]


def _start(policy: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    with policy.with_suffix(".log").open("w") as log:
        return subprocess.Popen(
            _argv(policy), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
        )


def _log(policy: Path) -> str:
    return policy.with_suffix(".log").read_text()


def _published(env: dict[str, str], name: str, gov: subprocess.Popen[str]) -> None:
    state = Path(env["GOVERNOR_RUN_DIR"]) / name / "state.json"

    def ready() -> bool:
        assert gov.poll() is None, f"{name}'s governor exited {gov.returncode}"
        return state.exists()

    cgroups.wait_for(ready, 90, f"{name}'s published state")


def _stop(*govs: subprocess.Popen[str]) -> None:
    for gov in govs:
        if gov.poll() is None:
            gov.send_signal(signal.SIGTERM)
    for gov in govs:
        gov.wait(timeout=60)


def _refusal(name: str, holder: str, mib: int, board: Path) -> str:
    left = Budget.of(_memtotal()).budget - (mib << 20)
    return (
        f"governor: the board cannot admit {name}: memory.min {gib(mib << 20)},"
        f" {gib(left)} of guarantees left, {short((mib << 20) - left)} short"
        f" ({holder} holds {gib(mib << 20)}) ([qos] admit, {board})"
    )


def test_guarantees_over_the_budget_refuse_with_75_and_wait_admits_once_the_holder_exits(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    env = _env(tmp_path)
    mib = _share(0.6)
    hold = _policy(tmp_path, scratch_slice, "hold", f'[memory]\nmin = "{mib}M"\n')
    chat = _policy(tmp_path, scratch_slice, "chat", f'[memory]\nmin = "{mib}M"\n')
    first = _start(hold, env)
    waiter: subprocess.Popen[str] | None = None
    try:
        _published(env, "hold", first)
        assert (scratch_slice.path / "hold" / "memory.min").read_text() == f"{mib << 20}\n"
        refused = subprocess.run(
            _argv(chat), cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert refused.returncode == 75, refused.stderr
        assert refused.stderr.splitlines()[0] == _refusal(
            "chat", "hold", mib, tmp_path / "board.toml"
        ), refused.stderr
        # nothing of it applied: no group, no state, the parent's protection is hold's alone
        assert not (scratch_slice.path / "chat").exists()
        assert not (Path(env["GOVERNOR_RUN_DIR"]) / "chat" / "state.json").exists()
        # admit = "wait": says who holds the room, starts as soon as hold has exited
        chat.write_text(chat.read_text() + '[qos]\nadmit = "wait"\nadmit_timeout = "120s"\n')
        waiter = _start(chat, env)
        # admit_timeout = "120s", said as a duration is written (policy/durations.py): 2m
        cgroups.wait_for(lambda: "waiting up to 2m for" in _log(chat), 60, "the wait's line")
        assert "(hold holds" in _log(chat)
        assert not (scratch_slice.path / "chat").exists()
        _stop(first)
        _published(env, "chat", waiter)
        assert (scratch_slice.path / "chat" / "memory.min").read_text() == f"{mib << 20}\n"
        assert "chat admitted: admitted after waiting for room" in _log(chat)
    finally:
        _stop(first, *([waiter] if waiter else []))


def test_shed_stops_a_background_engine_and_starts_and_status_says_why(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    env = _env(tmp_path)
    mib = _share(0.6)
    bg = _policy(
        tmp_path, scratch_slice, "bg", f'[memory]\nmin = "{mib}M"\n[qos]\nclass = "background"\n'
    )
    chat = _policy(
        tmp_path,
        scratch_slice,
        "chat",
        f'[memory]\nmin = "{mib}M"\n[qos]\nclass = "interactive"\nadmit = "shed"\n',
    )
    victim = _start(bg, env)
    shedder: subprocess.Popen[str] | None = None
    try:
        _published(env, "bg", victim)
        shedder = _start(chat, env)
        _published(env, "chat", shedder)
        assert victim.wait(timeout=60) == 128 + signal.SIGTERM  # its engine was stopped
        run = Path(env["GOVERNOR_RUN_DIR"])
        (entry,) = [e for e in Journal(run / "bg").entries() if e["source"] == "shed"]
        assert (entry["step"], entry["by"], entry["when"]) == ("stop", "chat", "admission of chat")
        status = subprocess.run(
            [sys.executable, "-m", "governor", "status", "chat"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        (line,) = [ln for ln in status.stdout.splitlines() if " admit: " in ln]
        assert line.endswith(" admit: admitted after stopping bg (a lower class)"), status.stdout
        assert "admission of chat stops bg" in _log(chat)
    finally:
        _stop(victim, *([shedder] if shedder else []))


def test_two_launches_racing_for_the_last_room_one_starts_one_exits_75(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    env = _env(tmp_path)
    mib = _share(0.6)
    a = _policy(tmp_path, scratch_slice, "a", f'[memory]\nmin = "{mib}M"\n')
    b = _policy(tmp_path, scratch_slice, "b", f'[memory]\nmin = "{mib}M"\n')
    govs = [_start(a, env), _start(b, env)]
    try:
        cgroups.wait_for(lambda: any(g.poll() is not None for g in govs), 120, "one to exit")
        (lost,) = [g for g in govs if g.poll() is not None]
        (won,) = [g for g in govs if g is not lost]
        assert lost.returncode == 75
        loser, winner = ("a", "b") if lost is govs[0] else ("b", "a")
        assert f"the board cannot admit {loser}" in _log(a if loser == "a" else b)
        _published(env, winner, won)
        assert not (scratch_slice.path / loser).exists()
    finally:
        _stop(*govs)


def _gov(env: dict[str, str], *argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "governor", *argv],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_shed_never_stops_an_applied_slice_whose_claim_stays_and_refuses_at_once(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    """Issue 43 item 5: an `apply`d background slice keeps its state and memory.min after its
    processes are stopped: the shed admission does not SIGTERM them for nothing, it exits 75
    at once (not after admit_timeout), naming why."""
    env = _env(tmp_path)
    mib = _share(0.6)
    bg = _policy(
        tmp_path, scratch_slice, "bg", f'[memory]\nmin = "{mib}M"\n[qos]\nclass = "background"\n'
    )
    chat = _policy(
        tmp_path,
        scratch_slice,
        "chat",
        f'[memory]\nmin = "{mib}M"\n[qos]\nclass = "interactive"\nadmit = "shed"\n'
        'admit_timeout = "600s"\n',
    )
    done = _gov(env, "apply", str(bg))
    assert done.returncode == 0, done.stderr
    group = scratch_slice.path / "bg"
    state = json.loads((Path(env["GOVERNOR_RUN_DIR"]) / "bg" / "state.json").read_text())
    leaf = Path(state["cgroup_root"]) / state["leaf"]
    engine = subprocess.Popen(SLEEP)
    try:
        cgroups.write((leaf if leaf.is_dir() else group) / "cgroup.procs", engine.pid)
        before = cgroups.read(group / "memory.min")
        assert before == str(mib << 20)
        t0 = time.monotonic()
        refused = subprocess.run(
            _argv(chat), cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
            check=False,
        )  # fmt: skip
        took = time.monotonic() - t0
        assert refused.returncode == 75, refused.stderr
        assert refused.stderr.splitlines()[0].endswith(
            "and no lower class to shed frees enough; bg's claim stays after a stop (apply)"
            f" ([qos] admit, {tmp_path / 'board.toml'})"
        ), refused.stderr
        assert "stops bg" not in refused.stderr
        assert took < 300, took  # at once: not after its 600 s admit_timeout
        assert engine.poll() is None  # not SIGTERMed
        assert cgroups.read(group / "memory.min") == before
        assert [e for e in Journal(Path(env["GOVERNOR_RUN_DIR"]) / "bg").entries()
                if e["source"] == "shed"] == []  # fmt: skip
        assert not (scratch_slice.path / "chat").exists()
    finally:
        engine.kill()
        engine.wait()
        _gov(env, "remove", str(bg))


def test_an_applied_slice_whose_group_was_removed_is_stale_pruned_and_claims_nothing(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    """Issue 43 item 6: `status` said gone, `--prune` kept it, launches exited 75 naming it."""
    env = _env(tmp_path)
    mib = _share(0.6)
    held = _policy(tmp_path, scratch_slice, "held", f'[memory]\nmin = "{mib}M"\n')
    chat = _policy(tmp_path, scratch_slice, "chat", f'[memory]\nmin = "{mib}M"\n')
    done = _gov(env, "apply", str(held))
    assert done.returncode == 0, done.stderr
    gov: subprocess.Popen[str] | None = None
    try:
        refused = _gov(env, "launch", "--policy", str(chat), "--", *SLEEP)
        assert refused.returncode == 75 and "(held holds" in refused.stderr, refused.stderr
        group = scratch_slice.path / "held"
        for child in sorted(group.rglob("*"), reverse=True):  # the group, removed by hand
            if child.is_dir():
                child.rmdir()
        group.rmdir()
        status = _gov(env, "status", "--json", "held")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)[0]["state"] == "stale"
        text = _gov(env, "status", "held").stdout
        assert "STALE: its cgroup is gone" in text, text
        gov = _start(chat, env)  # the room it needed: admitted
        _published(env, "chat", gov)
        assert (scratch_slice.path / "chat" / "memory.min").read_text() == f"{mib << 20}\n"
        pruned = _gov(env, "status", "--prune", "held")
        assert "pruned held: its cgroup is gone" in pruned.stderr, pruned.stderr
        assert not (Path(env["GOVERNOR_RUN_DIR"]) / "held" / "state.json").exists()
    finally:
        _stop(*([gov] if gov else []))
