"""One typed record per shared run-dir file (issue 32 item 4): state.json reads back as a
RunState (governor/rundir/state.py load_state, the one reader), the clock ledger's entries as
ClockEntry/Holder (governor/rundir/clocks.py); a record read back and written again is the
file as it was, so a reader that rewrites (the ledger's lock, a monitor giving `governor
apply`'s state back) changes nothing it did not mean to.

Needs: a tmp directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fakefs.plans import make_plan

from governor.kernel.parse import parse_stat_starttime
from governor.plan.model import Plan
from governor.rundir.clocks import ClockEntry, Holder, Ledger
from governor.rundir.liveness import alive, own_start
from governor.rundir.state import Publisher, RunState, applied, load_state, prune_stale, read_states


def _plan(policy: str = "chat") -> dict[str, object]:
    return make_plan(policy=policy, group=f"governor.slice/{policy}").to_dict()


def test_states_read_back_as_records_with_the_readers_stale(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    (cg / "governor.slice/chat").mkdir(parents=True)  # an apply state holds while it exists
    plan = {**_plan(), "cgroup_root": str(cg)}
    Publisher(tmp_path, "chat").publish(
        applied(
            Plan.from_dict(plan),
            policy_path="/p/chat.toml",
            created=["governor.slice/chat"],
            started_at=1.5,
        )
    )
    gone = {"policy": "dead", "source": "launch", "pid": 2**22 + 7, "plan": _plan("dead")}
    Publisher(tmp_path, "dead").publish(gone)
    states = read_states(tmp_path)
    assert all(isinstance(s, RunState) for s in states)
    assert [(s.policy, s.source, s.stale) for s in states] == [
        ("chat", "apply", False),
        ("dead", "launch", True),
    ]
    assert states[0].created == ["governor.slice/chat"] and states[0].started_at == 1.5


def test_a_state_that_says_stale_itself_is_not_believed(tmp_path: Path) -> None:
    """``stale`` is the reader's (the pid's liveness), never the file's."""
    (tmp_path / "chat").mkdir()
    path = tmp_path / "chat" / "state.json"
    path.write_text(json.dumps({"policy": "chat", "source": "apply", "stale": True}))
    assert load_state(path).stale is False
    assert [s.stale for s in read_states(tmp_path)] == [False]


def test_a_state_read_back_and_published_again_is_the_same_file(tmp_path: Path) -> None:
    publisher = Publisher(tmp_path, "chat")
    publisher.publish(
        applied(
            Plan.from_dict(_plan()),
            policy_path="/p/chat.toml",
            created=["a", "a/b"],
            started_at=2.25,
        )
    )
    before = publisher.path.read_bytes()
    again = publisher.read()
    assert again is not None
    publisher.publish(again)
    assert publisher.path.read_bytes() == before
    # one written by hand (or an older governor) without a start time stays readable
    publisher.publish({"policy": "chat", "source": "apply", "plan": _plan()})
    hand = publisher.read()
    assert hand is not None and hand.started_at is None
    publisher.publish(hand)
    assert publisher.read() == hand


def test_the_ledger_reads_typed_entries_and_writes_them_back_byte_for_byte(
    tmp_path: Path,
) -> None:
    dev = str(tmp_path / "sys" / "devices" / "system" / "cpu" / "cpufreq" / "policy4")
    os.makedirs(dev)
    entry = {
        "key": "big",
        "kind": "cpufreq",
        "name": "policy4",
        "path": dev,
        "request": [["scaling_governor", "performance"]],
        "saved": [["scaling_governor", "schedutil"]],
        "holders": [
            {"policy": "chat", "pid": 12, "source": "launch"},
            {"policy": "batch", "pid": None, "source": "apply"},
        ],
        "failed": ["x reads back y"],
    }
    ledger_file = tmp_path / "clocks.json"
    ledger_file.write_text(json.dumps({"format": 1, "devices": {dev: entry}}, indent=1))
    before = ledger_file.read_bytes()
    ledger = Ledger(tmp_path, tmp_path / "sys")
    (read,) = ledger.read().values()
    assert isinstance(read, ClockEntry)
    assert read.holders == [Holder("chat", 12, "launch"), Holder("batch", None, "apply")]
    assert read.failed == ["x reads back y"] and read.saved == [["scaling_governor", "schedutil"]]
    assert read.holder_names() == "chat (pid 12), batch (governor apply)"
    with ledger.locked() as entries:
        assert entries == {dev: read}
    assert ledger_file.read_bytes() == before


def test_the_published_plan_is_read_once_through_the_record(tmp_path: Path) -> None:
    """status, metrics, tune and the board's scan take the state's plan as RunState.plan: a
    Plan parsed once when the state is read (issue 44: no dict handed around to be parsed
    again), or None for a state without one (never a traceback); written back as the dict."""
    Publisher(tmp_path, "chat").publish(
        applied(Plan.from_dict(_plan()), policy_path="/p/chat.toml", created=[], started_at=1.0)
    )
    Publisher(tmp_path, "bare").publish({"policy": "bare", "source": "apply"})
    by_name = {s.policy: s for s in read_states(tmp_path)}
    assert by_name["bare"].plan is None
    chat = by_name["chat"].plan
    assert isinstance(chat, Plan)
    assert chat.group == "governor.slice/chat" and chat.policy == "chat"
    assert by_name["chat"].to_json()["plan"] == chat.to_dict() == _plan()


# ------------------------------------------------------------------ liveness (issue 43 item 6)

STAT = "{pid} (gov ernor) S 1 {pid} {pid} 0 -1 4194560 9 0 0 0 0 0 0 0 20 0 1 0 {start} 1 1"


def fake_proc(tmp_path: Path, pid: int, cmdline: bytes, start: int) -> Path:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cmdline").write_bytes(cmdline)
    (proc / str(pid) / "stat").write_text(STAT.format(pid=pid, start=start) + "\n")
    return proc


def test_stat_starttime_is_field_22_counted_after_the_comms_last_paren() -> None:
    assert parse_stat_starttime(STAT.format(pid=7, start=4242)) == 4242
    odd = "7 (a) b) c) S 1 7 7 0 -1 4194560 9 0 0 0 0 0 0 0 20 0 1 0 99 1 1"
    assert parse_stat_starttime(odd) == 99
    own = (Path("/proc/self/stat")).read_text()
    assert parse_stat_starttime(own) > 0 and own_start() == parse_stat_starttime(
        Path(f"/proc/{os.getpid()}/stat").read_text()
    )


def test_a_pid_alive_but_started_at_another_time_is_stale(tmp_path: Path) -> None:
    """A dead supervisor's pid reused by `vim /etc/governor/board.toml`, or by another
    governor: the start time it published is not the running process's."""
    proc = fake_proc(tmp_path, 4321, b"vim\0/etc/governor/board.toml\0", start=5000)
    state = {"policy": "chat", "source": "launch", "pid": 4321, "pid_start": 1000,
             "plan": _plan()}  # fmt: skip
    run = tmp_path / "run"
    Publisher(run, "chat").publish(state)
    assert [s.stale for s in read_states(run, proc)] == [True]
    assert alive(4321, proc, start=5000) and not alive(4321, proc, start=1000)
    # the same pid and start time: the publisher itself, whatever its command line says
    fake_proc(tmp_path, 4321, b"python3\0-m\0governor\0launch\0", start=1000)
    assert [s.stale for s in read_states(run, proc)] == [False]
    fake_proc(tmp_path, 4321, b"python3\0-m\0governor\0launch\0", start=1001)  # reused
    assert [s.stale for s in read_states(run, proc)] == [True]
    assert prune_stale(run, proc=proc) == [("chat", 4321)]


def test_a_state_without_a_start_time_falls_back_to_the_command_line(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 4321, b"python3\0-m\0governor\0launch\0", start=5000)
    run = tmp_path / "run"
    Publisher(run, "chat").publish(
        {"policy": "chat", "source": "launch", "pid": 4321, "plan": _plan()}
    )
    assert [s.stale for s in read_states(run, proc)] == [False]
    fake_proc(tmp_path, 4321, b"sleep\060\0", start=5000)
    assert [s.stale for s in read_states(run, proc)] == [True]


def test_an_applied_state_whose_cgroup_is_gone_is_stale_and_pruned(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    (cg / "governor.slice/chat").mkdir(parents=True)
    run = tmp_path / "run"
    plan = {**_plan(), "cgroup_root": str(cg)}
    Publisher(run, "chat").publish(
        applied(Plan.from_dict(plan), policy_path=None, created=[], started_at=1.0)
    )
    assert [s.stale for s in read_states(run)] == [False]
    assert prune_stale(run) == []
    (cg / "governor.slice/chat").rmdir()
    assert [s.stale for s in read_states(run)] == [True]
    assert prune_stale(run) == [("chat", None)]
    assert read_states(run) == []
    odd = applied(
        Plan.from_dict({**plan, "group": "../chat"}), policy_path=None, created=[], started_at=1.0
    )
    Publisher(run, "chat").publish(odd)  # a hand's: read, never a crash of the scan
    assert [s.group for s in read_states(run)] == ["../chat"]
