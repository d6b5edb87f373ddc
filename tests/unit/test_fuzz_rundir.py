"""Bad run-dir files, generated: whatever a state.json, a journal.jsonl or the clock ledger
holds (another process wrote it, or a crash, a full disk, a hand), its one validating reader
(governor/rundir/state.py load_state, governor/rundir/journal.py check_entry,
governor/rundir/clocks.py check_entry) gives a typed record or one line for THAT file or
entry, the readers behind it (status, the journal's folds, the clock acquisition and release)
never raise anything but a GovernorError, and no clock write lands outside the sysfs root.

As in tests/unit/test_fuzz.py, most examples are WELL-FORMED files with a few hostile values
(a real state, journal or ledger with some keys dropped, retyped or pointed elsewhere), so that
they reach the code behind the reader; each test reports its reach and asserts a floor.

Needs: the rk3588 host fixture (its cgroup and clock trees)."""

from __future__ import annotations

import collections
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers.clocks import DMC, NPU, POLICY0, POLICY4, board, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor.api import host as api_host
from governor.backends.clocks import ANY_PID, BoardClocks
from governor.compile.compiler import compile_plan
from governor.errors import GovernorError
from governor.operate.status import collect, render
from governor.plan.host import probe
from governor.plan.model import Plan
from governor.policy.loader import load_text
from governor.rundir.clocks import Ledger
from governor.rundir.journal import Journal
from governor.rundir.state import RunState, StateError, applied, load_state, scan_states

from .test_fuzz import _VALUES, Reach, _fraction, _summary

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
RK3588 = HOSTS / "rk3588"
_PERCENT = st.integers(0, 99)
_FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _one_line(err: GovernorError | StateError) -> None:
    assert "\n" not in str(err) and str(err).strip(), repr(str(err))


def _corrupt(draw: st.DrawFn, data: bytes) -> bytes:
    """Usually the bytes as written; else truncated, or with bytes that are not UTF-8."""
    n = draw(_PERCENT)
    if n < 80:
        return data
    if n < 90:
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    at = draw(st.integers(0, len(data)))
    return data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\n"])) + data[at:]


def _retype(draw: st.DrawFn, value: Any, depth: int = 0) -> Any:
    """``value`` with one hostile value somewhere inside it (a nested dict's or list's item)."""
    if isinstance(value, dict) and value and depth < 3 and draw(_PERCENT) < 60:
        key = draw(st.sampled_from(sorted(value)))
        return {**value, key: _retype(draw, value[key], depth + 1)}
    if isinstance(value, list) and value and depth < 3 and draw(_PERCENT) < 60:
        i = draw(st.integers(0, len(value) - 1))
        return [*value[:i], _retype(draw, value[i], depth + 1), *value[i + 1 :]]
    return draw(_VALUES)


# ---------------------------------------------------------------- state.json

_PLANS: dict[str, Plan] = {}


def _plan() -> Plan:
    if "st" not in _PLANS:
        policy = load_text(
            'name = "st"\n[memory]\nhigh = "1G"\n[[pressure]]\nwhen = "memory some 150ms/2s"\n'
            'do = ["log"]\n',
            source="st.toml",
        )
        _PLANS["st"] = compile_plan(policy, probe(RK3588), source="st.toml")
    return _PLANS["st"]


def _state() -> dict[str, Any]:
    """A launch's state as the supervisor publishes it (a rule, an action, the totals)."""
    base = applied(_plan(), policy_path="/p/st.toml", created=[], started_at=5.0)
    return {
        **base.to_json(),
        "source": "launch",
        "pid": 2**22 + 3,
        "pid_start": 123456,  # issue 43: the supervisor's start time (liveness)
        "engine_pid": 2**22 + 4,
        "kept_by": "launch --keep",
        "restarts": 0,
        "rules": [{"rule": 0, "when": "memory some 150ms/2s", "state": "armed", "fired": 1,
                   "next_actions": ["log"], "since": 6.0}],
        "last_actions": [{"rule": 0, "when": "memory some", "at": 7.0,
                          "actions": [{"action": "log"}]}],
        "action_totals": [{"rule": 0, "action": "log", "count": 1}],
        "shed_totals": [{"victim": "b", "step": "throttle", "count": 2}],
        "board": {"unaccounted": 5},
        "ready": True,
    }  # fmt: skip


@st.composite
def _state_file(draw: st.DrawFn) -> bytes:
    state = _state()
    for _ in range(draw(st.integers(0, 2))):
        if draw(_PERCENT) < 30:
            state.pop(draw(st.sampled_from(sorted(state))), None)
        else:
            key = draw(st.sampled_from(sorted(state)))
            state[key] = _retype(draw, state[key])
    try:
        data = json.dumps({"format": 1, **state}).encode()
    except (TypeError, ValueError):
        data = b"{"
    return _corrupt(draw, data)


def test_any_state_file_is_a_state_or_one_line_and_hides_no_other(
    tmp_path: Path, report_reach: Callable[[str], None]
) -> None:
    reach: Reach = collections.Counter()
    cg = tmp_path / "cg"
    shutil.copytree(RK3588 / "sys" / "fs" / "cgroup", cg)
    plan = api_host.check(
        _write(tmp_path / "good.toml", 'name = "good"\n[memory]\nhigh = "1G"\n'),
        api_host.HostOptions(root=RK3588, cgroup_root=cg),
    )
    good = applied(plan, policy_path=None, created=[], started_at=1.0).to_json()

    @_FUZZ
    @given(_state_file())
    def run(data: bytes) -> None:
        reach["examples"] += 1
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp)
            (run_dir / "good").mkdir()
            (run_dir / "good" / "state.json").write_text(json.dumps(good))
            (run_dir / "st").mkdir()
            (run_dir / "st" / "state.json").write_bytes(data)
            try:
                state = load_state(run_dir / "st" / "state.json")
            except StateError as err:
                _one_line(err)
                reach["one line"] += 1
            else:
                reach["read"] += 1
                assert isinstance(state, RunState) and state.policy == "st"
            states, errors = scan_states(run_dir)
            assert "good" in [s.policy for s in states] and len(errors) <= 1
            items = collect(run_dir)
            assert "good" in [it["policy"] for it in items]
            render(items)
            if any(it["policy"] == "st" for it in items):
                reach["status shows it"] += 1

    run()
    report_reach(_summary("state.json", reach, ("read", "status shows it", "one line")))
    assert _fraction(reach, "read") >= 0.3, "many states must get past the reader"
    assert _fraction(reach, "one line") >= 0.2, "many states must be refused"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---------------------------------------------------------------- journal.jsonl

_CHANGE = {"cgroup": "governor.slice/st", "file": "memory.high", "before": "max", "after": "1G"}


@st.composite
def _journal(draw: st.DrawFn) -> bytes:
    entries: list[dict[str, Any]] = []
    for i in range(1, draw(st.integers(1, 6)) + 1):
        kind = draw(st.sampled_from(["tune", "tune", "rollback", "confirm", "shed", "monitor"]))
        e: dict[str, Any] = {"id": i, "time": float(i), "source": kind, "changes": [_CHANGE]}
        if kind == "tune" and draw(_PERCENT) < 40:
            e["confirm_by"] = 100.0 + i
        if kind == "rollback":
            e["undoes"] = [draw(st.integers(1, i))]
        if kind == "confirm":
            e["changes"], e["confirms"] = [], [draw(st.integers(1, i))]
        if kind == "shed":
            e |= {"by": "chat", "pid": 7, "when": "memory some",
                  "step": draw(st.sampled_from(["throttle", "freeze", "thaw", "release", "x"]))}  # fmt: skip
        if draw(_PERCENT) < 25:
            key = draw(st.sampled_from(sorted(e)))
            e[key] = _retype(draw, e[key])
        try:
            entries.append(e)
            json.dumps(e)
        except (TypeError, ValueError):
            entries[-1] = {"id": i}
    lines = [json.dumps(e).encode() for e in entries]
    return _corrupt(draw, b"\n".join(lines) + b"\n")


def test_any_journal_reads_entry_by_entry_and_its_folds_never_raise(
    report_reach: Callable[[str], None],
) -> None:
    reach: Reach = collections.Counter()

    @_FUZZ
    @given(_journal())
    def run(data: bytes) -> None:
        reach["examples"] += 1
        with tempfile.TemporaryDirectory() as tmp:
            journal = Journal(Path(tmp))
            journal.path.write_bytes(data)
            entries = journal.entries()
            reach["entries"] += len(entries)
            reach["lines skipped"] += len(journal.problems)
            for problem in journal.problems:
                assert "\n" not in problem and str(journal.path) in problem
            if entries and not journal.problems:
                reach["all read"] += 1
            journal.tuned("memory.high")
            journal.pending()
            journal.shed(lambda pid: True)
            journal.tail()
            assert journal.append("confirm", [], confirms=[])["id"] > max(
                (e["id"] for e in entries), default=0
            )

    run()
    report_reach(
        _summary("journal", reach, ("all read",))
        + f"; {reach['entries']} entries read, {reach['lines skipped']} lines skipped"
    )
    assert _fraction(reach, "all read") >= 0.3, "many journals must be read whole"
    assert reach["lines skipped"] > 0, "some lines must be refused"


# ---------------------------------------------------------------- the clock ledger

_DEVICES = {
    "dmc": ("devfreq", DMC, ["governor", "min_freq"]),
    "npu": ("devfreq", NPU, ["governor", "max_freq"]),
    "little": ("cpufreq", POLICY0, ["scaling_governor", "scaling_min_freq"]),
    "big": ("cpufreq", POLICY4, ["scaling_governor", "scaling_max_freq"]),
}


@st.composite
def _ledger(draw: st.DrawFn, sysfs: Path, outside: Path) -> dict[str, Any]:
    devices: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(sorted(_DEVICES)), max_size=3, unique=True)):
        kind, rel, files = _DEVICES[key]
        path = str(sysfs / rel)
        if draw(_PERCENT) >= 60:  # a device (or a file) somewhere else
            path = draw(st.sampled_from([str(outside), f"{sysfs}/../outside", "/etc", "rel"]))
        saved = [[f, draw(st.sampled_from(["1", "performance", "408000"]))] for f in files]
        if draw(_PERCENT) >= 70:
            saved[0][0] = draw(st.sampled_from(["../../../outside/f", "/etc/x", "f/../../g"]))
        holders = [{"policy": draw(st.sampled_from(["chat", "batch"])),
                    "pid": draw(st.sampled_from([999999, None, 7])), "source": "launch"}]  # fmt: skip
        entry: dict[str, Any] = {
            "key": key, "kind": kind, "name": rel.rsplit("/", 1)[1], "path": path,
            "request": [[files[0], "performance"]], "saved": saved, "holders": holders,
        }  # fmt: skip
        if draw(_PERCENT) < 10:
            entry["failed"] = ["earlier"]
        if draw(_PERCENT) < 20:
            field = draw(st.sampled_from(sorted(entry)))
            entry[field] = _retype(draw, entry[field])
        devices[path] = entry
    return devices


def test_any_clock_ledger_never_makes_a_write_outside_the_sysfs_root(
    tmp_path: Path, report_reach: Callable[[str], None]
) -> None:
    reach: Reach = collections.Counter()
    sysfs = board(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("governor", "min_freq", "max_freq", "f", "scaling_governor"):
        (outside / name).write_text("untouched\n")
    before = {p.name: p.read_text() for p in outside.iterdir()}
    plan = compile_plan(
        load_text('name = "chat"\n[clocks]\ndmc = "performance"\n', source="c.toml"),
        probe(RK3588, sysfs_root=sysfs),
        source="c.toml",
    )
    pristine = snapshot(sysfs)
    run_dir = tmp_path / "run"

    @_FUZZ
    @given(_ledger(sysfs, outside), st.booleans())
    def run(devices: dict[str, Any], corrupt: bool) -> None:
        reach["examples"] += 1
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir()
        data = json.dumps({"format": 1, "devices": devices}).encode()
        (run_dir / "clocks.json").write_bytes(data[: len(data) // 2] if corrupt else data)
        reader = Ledger(run_dir, sysfs)
        valid = reader.read()
        reach["entries valid"] += len(valid)
        reach["entries refused"] += len(reader.problems)
        clocks = BoardClocks(run_dir, sysfs_root=sysfs, alive=lambda pid: pid == 7)
        try:
            clocks.acquire(plan, pid=7, source="launch")
            reach["acquired"] += 1
            clocks.release("chat", pid=ANY_PID)
            reach["released"] += 1
        except GovernorError as err:
            _one_line(err)
        assert {p.name: p.read_text() for p in outside.iterdir()} == before
        for rel, value in pristine.items():  # put the board back for the next example
            (sysfs / rel).write_text(value)

    run()
    report_reach(
        _summary("clock ledger", reach, ("acquired", "released"))
        + f"; {reach['entries valid']} entries valid, {reach['entries refused']} refused"
    )
    assert _fraction(reach, "acquired") >= 0.3, "many ledgers must reach the acquisition"
    assert reach["entries refused"] > 0, "some entries must be refused"
