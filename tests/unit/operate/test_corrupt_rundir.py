"""Run-dir files another process wrote (state.json, journal.jsonl) go through one validating
reader each (governor/rundir/state.py load_state, governor/rundir/journal.py check_entry): a file
that is truncated, not JSON, not UTF-8 or has the wrong types is skipped with one line naming it,
never a traceback, and never hides the other slices from status, top, metrics, prune, tune
--confirm, rollback or a running shedder.

Needs: a tmp directory (a copy of the rk3588 fixture's cgroup tree)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from governor.api import host as api_host
from governor.cli.app import main
from governor.kernel.cgroupfs import CgroupFs
from governor.monitor.actions.shedder import Shedder
from governor.operate.status import collect, render
from governor.plan.model import Plan
from governor.rundir.journal import Journal
from governor.rundir.state import Publisher, applied, prune_stale, read_states, scan_states

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"


def _plans(tmp_path: Path) -> dict[str, Plan]:
    """good and bad (background), chat (interactive), compiled; then their groups made."""
    cg = tmp_path / "cg"
    shutil.copytree(HOSTS / "rk3588" / "sys" / "fs" / "cgroup", cg)
    plans = {}
    for name, qos in (("good", "background"), ("bad", "background"), ("chat", "interactive")):
        policy = tmp_path / f"{name}.toml"
        policy.write_text(f'name = "{name}"\n[memory]\nhigh = "1G"\n[qos]\nclass = "{qos}"\n')
        opts = api_host.HostOptions(root=HOSTS / "rk3588", cgroup_root=cg)
        plans[name] = api_host.check(policy, opts)
    for plan in plans.values():
        group = cg / plan.group
        group.mkdir(parents=True, exist_ok=True)
        for w in plan.writes:
            (group / w.file).write_text(w.value + "\n")
    return plans


def _good_state(plan: Plan) -> dict[str, object]:
    return applied(plan, policy_path=None, created=[], started_at=1.0).to_json()


# what a crash, a full disk or a careless hand leaves: bytes of state.json
BAD_FILES: dict[str, bytes] = {
    "truncated": b'{"format": 1, "policy": "bad", "sou',
    "not-json": b"policy = bad\n",
    "not-utf8": b'{"policy": "bad\xff\xfe"}',
    "a-list": b"[1, 2, 3]",
    "null": b"null",
}
# and a JSON object whose values have the wrong types (each on top of a good state)
BAD_VALUES: dict[str, object] = {
    "pid": "123",
    "pid_start": -1,
    "kept_by": 5,
    "engine_pid": -5,
    "started_at": "yesterday",
    "rules": [{"rule": 0, "state": 5}],
    "last_actions": {"at": 1},
    "action_totals": [["rule", 0]],
    "shed_totals": [{"victim": None, "count": "x"}],
    "router": {"url": "http://127.0.0.1:1", "models": {"a": {"last_request": "now"}}},
    "qos": {"class": 3},
    "plan": {"policy": "bad"},
    "created": "governor.slice",
    "systemd": {"unit": 7},
    "board": {"unaccounted": "lots"},
    "restarts": True,
    "source": ["launch"],
    "policy": "other",
}


def _cases() -> list[tuple[str, bytes | dict[str, object]]]:
    return [*BAD_FILES.items(), *((f"value-{k}", {k: v}) for k, v in BAD_VALUES.items())]


@pytest.mark.parametrize(("case", "bad"), _cases(), ids=[c for c, _ in _cases()])
def test_one_bad_state_hides_no_other_slice_and_raises_nowhere(
    tmp_path: Path,
    case: str,
    bad: bytes | dict[str, object],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    plans = _plans(tmp_path)
    good, bad_plan = plans["good"], plans["bad"]
    Publisher(run, "good").publish(_good_state(good))
    path = run / "bad" / "state.json"
    path.parent.mkdir(parents=True)
    if isinstance(bad, bytes):
        path.write_bytes(bad)
    else:
        path.write_text(json.dumps({"format": 1, **_good_state(bad_plan), **bad}))
    before = path.read_bytes()

    states, errors = scan_states(run)
    assert [s.policy for s in states] == ["good"]
    assert [e.path for e in errors] == [path] and str(path) in str(errors[0])
    items = collect(run)
    assert [it["policy"] for it in items] == ["good"]
    assert "good" in render(items)
    assert prune_stale(run) == []
    assert path.read_bytes() == before  # nothing but the reader looked at it
    shedder = plans["chat"]
    assert [
        v.name
        for v in Shedder(CgroupFs(tmp_path / "cg"), shedder, run=run, own_cgroup="").victims()
    ] == ["good"]

    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    cg = ["--root", str(HOSTS / "rk3588"), "--cgroup-root", str(tmp_path / "cg")]
    for argv, code in (
        (["status"], 0),
        (["status", "--prune"], 0),
        (["status", "--json"], 0),
        (["top", "-b", "-n", "1"], 0),
        (["metrics"], 0),
        (["status", "bad"], 66),
        (["rollback", "bad"], 66),
        (["tune", "bad", "--confirm"], 66),
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*cg, *argv])
        out, err = capsys.readouterr()
        assert exit_.value.code in (code, None if code == 0 else code), (argv, out, err)
        assert "Traceback" not in err, (argv, err)
        if code == 66:
            assert err.startswith("governor: the state of bad is not readable:"), (argv, err)
            assert err.count("\n") <= 3, err
        elif argv[0] != "metrics":
            assert "good" in out, (argv, out)
    assert path.read_bytes() == before


BAD_LINES = [
    b'{"id": 3, "time": 1.0, "source": "tune", "chan',  # truncated
    b"\xff\xfe not utf-8",
    b"[]",
    b'{"id": "4", "time": 1.0, "source": "tune", "changes": []}',
    b'{"id": 5, "time": 1.0, "source": "tune", "changes": [{"file": 7}]}',
    b'{"id": 6, "time": 1.0, "source": "rollback", "changes": [], "undoes": "1"}',
    b'{"id": 7, "time": null, "source": "tune", "changes": []}',
    b'{"id": 8, "time": 1.0, "source": "shed", "changes": [], "pid": "x"}',
    # paths a rollback would write back to: only a clean cgroup and a bare file name pass
    b'{"id": 9, "time": 1.0, "source": "tune", "changes": [{"cgroup": "../../etc",'
    b' "file": "passwd", "before": "x", "after": "y"}]}',
    b'{"id": 10, "time": 1.0, "source": "tune", "changes": [{"cgroup": "g",'
    b' "file": "../../../etc/passwd", "before": "x", "after": "y"}]}',
]


def test_bad_journal_lines_are_skipped_one_by_one_and_the_good_ones_hold(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    first = journal.append(
        "tune", [{"cgroup": "g", "file": "memory.high", "before": "max", "after": "1G"}]
    )
    with open(journal.path, "ab") as f:
        f.write(b"\n".join(BAD_LINES) + b"\n")
    entries = journal.entries()
    assert [e["id"] for e in entries] == [first["id"]]
    assert len(journal.problems) == len(BAD_LINES)
    assert all(str(journal.path) in p for p in journal.problems)
    assert journal.tuned("memory.high") == "1G"
    assert journal.pending() == [] and journal.shed() is None
    assert journal.append("confirm", [], confirms=[1])["id"] == 2  # after the last good one
    assert [e["id"] for e in journal.entries()] == [1, 2]


def test_rollback_and_metrics_read_past_a_corrupt_journal_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    good = _plans(tmp_path)["good"]
    state = {**_good_state(good), "source": "launch", "pid": os.getpid()}
    Publisher(run, "good").publish(state)
    journal = Journal(run / "good")
    high = tmp_path / "cg" / good.group / "memory.high"
    journal.append("tune", [{"cgroup": good.group, "file": "memory.high", "before": "max",
                             "after": high.read_text().strip()}])  # fmt: skip
    with open(journal.path, "ab") as f:
        f.write(b"\n".join(BAD_LINES) + b"\n")
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    monkeypatch.setattr("governor.rundir.state.alive", lambda pid, proc=None, **_kw: True)
    cg = ["--root", str(HOSTS / "rk3588"), "--cgroup-root", str(tmp_path / "cg")]
    for argv in (["metrics", "good"], ["rollback", "good"]):
        with pytest.raises(SystemExit) as exit_:
            main([*cg, *argv])
        out, err = capsys.readouterr()
        assert exit_.value.code in (0, None), (argv, out, err)
        assert "Traceback" not in err
    assert high.read_text().strip() == "max"  # the good tune was rolled back
    assert read_states(run)[0].policy == "good"
