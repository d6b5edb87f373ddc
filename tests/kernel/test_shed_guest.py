"""QoS shedding (issue 23) against the real kernel, in the guest (2 GiB, no swap).

The issue's scenario, scaled to the guest: a background job (its own supervisor, class
background, yield throttle + freeze) grows its memory slowly; an interactive engine (class
interactive, `shed` on the board's MemAvailable floor) then takes a large share of the board.
The shed throttles the background (memory.high := its usage), then freezes it while the floor
is still crossed, never stops or kills it (its yield), and once the interactive engine gave its
memory back the undo thaws it and raises memory.high in steps: the job resumes and completes.
Nothing is OOM-killed. The job's own rule, which tries to lift its memory.high whenever it is
throttled, keeps the shed's value as its baseline. A second test kills the shedding governor
(SIGKILL) while it holds an ungoverned cgroup of the board file frozen and throttled: its
watchdog thaws it and gives its memory.high back.

A third test is the issue's scenario on the board's PSI trigger: an interactive engine
(tests/helpers/kvchat.py: every step reads its mmapped model, its KV cache grows; memory.min
covers both) and, once it has most of its memory, a background job that would take more than
the board has left. `board memory some 50ms/1s` sheds the job (throttle, then freeze while the
chat still grows) before anything is OOM-killed; the chat's model stays resident (its group's
refaults stay near zero: the time-free stand-in for its speed); once the chat has ended the job
is given back its memory.high, grows and completes. The stall the throttled job makes itself,
which the board's pressure counts, does not freeze it (governor/monitor/ownstall.py).

No speed ratios here: perf/qos.py measures them, interleaved and repeated (a benchmark, not a
test; tests never assert on time).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine.paths import SMALL
from helpers import cgroups
from helpers.cgroups import ScratchSlice

from governor.rundir.journal import Journal
from governor.rundir.liveness import alive

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
BG_START_MIB = 96  # the background job's memory when the interactive engine starts growing
BG_TARGET_MIB = 320  # ... and when it has completed its work
BG_HIGH_MIB = 600  # its policy's memory.high: what the undo gives back
COMPAT = os.environ.get("GOVERNOR_TEST_COMPAT") is not None  # a compat tier (tests/vm/harness.py)


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/meminfo")


def _oom_kills() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def _policy(tmp_path: Path, slice_: ScratchSlice, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nslice = "{slice_.name}"\n' + textwrap.dedent(body))
    return path


def _launch(policy: Path, env: dict[str, str], *argv: str) -> subprocess.Popen[str]:
    """`governor launch`, its log in POLICY.log (a file: a pipe nobody reads would fill up)."""
    with policy.with_suffix(".log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *argv],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def _log(policy: Path) -> str:
    return policy.with_suffix(".log").read_text()


def _env(tmp_path: Path, board: Path | None = None) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir(mode=0o755, exist_ok=True)
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    env["GOVERNOR_BOARD"] = str(board or tmp_path / "no-board.toml")
    return env


def _steps(journal: Path) -> list[str]:
    return [e["step"] for e in Journal(journal).entries() if e["source"] == "shed"]


def _events(stderr: str, name: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("event") == name:
                out.append(rec)
    return out


def _until(
    pred: Callable[[], object], timeout: float, what: str, *govs: subprocess.Popen[str]
) -> None:
    """Wait for pred(); fail at once when one of the governors has exited."""

    def check() -> object:
        for gov in govs:
            assert gov.poll() is None, f"a governor exited with {gov.returncode}: {gov.args!r}"
        return pred()

    cgroups.wait_for(check, timeout, what)


def _py(code: str) -> list[str]:
    return ["/usr/bin/python3", "-c", textwrap.dedent(code)]


def _background(marks: Path) -> list[str]:
    """Grows 4 MiB at a time (touched, anonymous) to BG_TARGET_MIB, writing its progress; exits
    0 once told to `finish`."""
    return _py(
        f"""
        import pathlib, time
        marks = pathlib.Path({str(marks)!r})
        chunks = []
        while len(chunks) * 4 < {BG_TARGET_MIB}:
            b = bytearray(4 << 20)
            b[::4096] = b"x" * len(range(0, 4 << 20, 4096))
            chunks.append(b)
            (marks / "bg-progress").write_text(str(len(chunks) * 4))
            time.sleep(0.25)
        (marks / "bg-done").write_text("1")
        while not (marks / "finish").exists():  # the test reads its group until then
            time.sleep(0.1)
        """
    )


def _interactive(marks: Path) -> list[str]:
    """Waits for `go` (its size in MiB), takes that much, holds it until `release`."""
    return _py(
        f"""
        import pathlib, time
        marks = pathlib.Path({str(marks)!r})
        while not (marks / "go").exists():
            time.sleep(0.1)
        n = int((marks / "go").read_text()) << 20
        b = bytearray(n)
        b[::4096] = b"x" * len(range(0, n, 4096))
        (marks / "grown").write_text("1")
        while not (marks / "release").exists():
            time.sleep(0.1)
        del b
        (marks / "freed").write_text("1")
        while True:
            time.sleep(1)
        """
    )


@pytest.mark.compat
@pytest.mark.kernel(controllers=("memory", "pids"), root=True)
def test_shed_throttles_then_freezes_the_background_and_gives_it_back(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    env = _env(tmp_path)
    run = Path(env["GOVERNOR_RUN_DIR"])
    floor_mib = (_meminfo("MemAvailable") >> 20) - 700
    bg_policy = _policy(
        tmp_path,
        scratch_slice,
        "bg",
        f"""
        [memory]
        high = "{BG_HIGH_MIB}M"
        max = "700M"
        swap_max = "0"
        [qos]
        class = "background"
        yield = ["throttle", "freeze"]
        [[pressure]]                 # its own supervisor would lift a throttle: a fight
        when = "high"
        do = ["set memory.high max"]
        """,
    )
    chat_policy = _policy(
        tmp_path,
        scratch_slice,
        "chat",
        f"""
        [qos]
        class = "interactive"
        [[pressure]]
        when = "board available < {floor_mib}M"
        do = ["log", "shed"]
        cooldown = "4s"
        """,
    )
    ooms = _oom_kills()
    bg = _launch(bg_policy, env, *_background(marks))
    # one launch after the other: two `governor launch` that create the same fresh parent
    # slice at once race (the second read the slice's cgroup.controllers before the first had
    # enabled memory in the root's subtree_control: exit 69; a known issue, not this test's)
    try:
        _until((run / "bg" / "state.json").exists, 240, "the job's governor", bg)
    except AssertionError:
        bg.kill()
        bg.wait(timeout=60)
        raise
    chat = _launch(chat_policy, env, *_interactive(marks))
    bg_group = scratch_slice.path / "bg"
    try:
        _until(
            lambda: (marks / "bg-progress").exists()
            and int((marks / "bg-progress").read_text() or 0) >= BG_START_MIB
            and (run / "chat" / "state.json").exists(),
            240, "the background job at its start size and the interactive engine", bg, chat,
        )  # fmt: skip
        # the interactive engine takes the board below the floor (with a margin) at once
        take = (_meminfo("MemAvailable") >> 20) - floor_mib + 150
        (marks / "go.tmp").write_text(str(take))
        (marks / "go.tmp").rename(marks / "go")  # never read half-written
        _until(
            lambda: "freeze" in _steps(run / "bg"), 120, "the background frozen by the shed", bg, chat
        )  # fmt: skip
        throttle = next(
            int(e["changes"][0]["after"])
            for e in Journal(run / "bg").entries()
            if e.get("step") == "throttle"
        )
        assert cgroups.read(bg_group / "cgroup.freeze") == "1"
        at_freeze = int((marks / "bg-progress").read_text() or 0)
        assert at_freeze < BG_TARGET_MIB, "the background job completed before the shed"
        assert int(cgroups.read(bg_group / "memory.high")) == throttle  # not lifted by its rule
        # `status` renders the hold from the run dir alone (tests/unit/operate/test_status.py
        # test_a_victim_shows_the_shed_that_holds_it_and_its_class): the kernel tier reads it
        # once on a real shed, a compat tier does not repeat it (~5-8 s a call under TCG)
        if not COMPAT:
            status = subprocess.run(
                [sys.executable, "-m", "governor", "status", "bg"],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            print(status.stdout, status.stderr)
            assert "SHED     frozen by chat since " in status.stdout, status.stdout
            assert ": board available < " in status.stdout, status.stdout
        # the rule keeps firing while the floor is crossed: nothing beyond the job's yield
        fired = json.loads((run / "chat" / "state.json").read_text())["rules"][0]["fired"]
        _until(
            lambda: json.loads((run / "chat" / "state.json").read_text())["rules"][0]["fired"]
            > fired,
            60, "the shedding rule firing again after the freeze", bg, chat,
        )  # fmt: skip
        state = json.loads((run / "chat" / "state.json").read_text())
        assert state["qos"]["class"] == "interactive"
        assert {(t["victim"], t["step"]) for t in state["shed_totals"]} == {
            ("bg", "throttle"),
            ("bg", "freeze"),
        }
        assert _steps(run / "bg") == ["throttle", "freeze"]  # yield: never stop, never kill
        # the interactive engine gives its memory back: quiet for the cooldown, then the undo
        (marks / "release").write_text("1")
        _until(lambda: "release" in _steps(run / "bg"), 180, "the shed undone", bg, chat)
        assert cgroups.read(bg_group / "cgroup.freeze") == "0"
        assert cgroups.read(bg_group / "memory.high") == str(BG_HIGH_MIB * MIB)
        # the job resumes and completes its work
        _until((marks / "bg-done").exists, 240, "the background job's work", bg)
        (marks / "finish").write_text("1")
        bg.wait(timeout=120)
    finally:
        for gov in (chat, bg):
            if gov.poll() is None:
                gov.send_signal(signal.SIGTERM)
            gov.wait(timeout=120)
        bg_err = _log(bg_policy)
        print(bg_err[-6000:], _log(chat_policy)[-6000:])
    assert bg.returncode == 0, bg_err[-3000:]
    assert (marks / "bg-done").exists()
    assert _oom_kills() == ooms, "something was OOM-killed"
    steps = _steps(run / "bg")
    assert steps[:3] == ["throttle", "freeze", "thaw"], steps
    assert steps[-1] == "release" and set(steps[3:-1]) == {"raise"}, steps
    raises = [
        int(e["changes"][0]["after"])
        for e in Journal(run / "bg").entries()
        if e.get("step") == "raise"
    ]
    assert raises == sorted(raises) and raises[-1] == BG_HIGH_MIB * MIB, raises
    # the job's own rule fired while throttled and kept the shed's value as its baseline
    lifts = [a for a in _events(bg_err, "action.done") if a["action"] == "set memory.high max"]
    assert lifts, "the background job was never throttled by its memory.high"
    assert all(int(a["after"]) <= BG_HIGH_MIB * MIB for a in lifts), lifts
    assert all(int(a["after"]) < 700 * MIB for a in lifts), lifts


@pytest.mark.kernel(controllers=("memory", "pids"), root=True)
def test_a_killed_shedders_watchdog_gives_a_board_cgroup_back(
    tmp_path: Path, scratch_slice: ScratchSlice, spawn: cgroups.Spawn
) -> None:
    """The board file's ungoverned cgroup (class background) is shed on a floor the board is
    always below, throttled then frozen; SIGKILL of the shedding governor: the watchdog
    thaws it and writes its memory.high back; its process lives on."""
    root = scratch_slice.root
    cgroups.write(root / "cgroup.subtree_control", "+memory")
    scratch_slice.create()
    cgroups.write(scratch_slice.path / "cgroup.subtree_control", "+memory")
    cam = scratch_slice.child("cam")
    sleeper = spawn(["sleep", "600"], cgroup=cam)
    board = tmp_path / "board.toml"
    board.write_text(
        f'[[cgroup]]\npath = "{scratch_slice.name}/cam"\nclass = "background"\n'
        'yield = ["throttle", "freeze"]\n'
    )
    env = _env(tmp_path, board)
    run = Path(env["GOVERNOR_RUN_DIR"])
    total_mib = _meminfo("MemTotal") >> 20
    chat_policy = _policy(
        tmp_path,
        scratch_slice,
        "chat",
        f"""
        [qos]
        class = "interactive"
        [[pressure]]
        when = "board available < {total_mib}M"
        do = ["shed"]
        cooldown = "1s"
        """,
    )
    chat = _launch(chat_policy, env, "/bin/sleep", "600")
    try:
        _until(
            lambda: "freeze" in _steps(run / "board" / "cam"), 180, "the board cgroup frozen", chat
        )
        assert cgroups.read(cam / "cgroup.freeze") == "1"
        assert cgroups.read(cam / "memory.high") != "max"
        chat.send_signal(signal.SIGKILL)
        chat.wait(timeout=60)
        cgroups.wait_for(
            lambda: cgroups.read(cam / "cgroup.freeze") == "0"
            and cgroups.read(cam / "memory.high") == "max",
            30, "the watchdog's revert",
        )  # fmt: skip
    finally:
        if chat.poll() is None:
            chat.kill()
            chat.wait(timeout=60)
        print(_log(chat_policy)[-4000:])
    assert sleeper.poll() is None  # thawed, not killed
    assert cgroups.read_kv(cam / "cgroup.events")["frozen"] == 0
    # the hold ended with its shedder (the journal has no release: it was SIGKILLed)
    assert _steps(run / "board" / "cam")[-1] == "freeze"
    assert Journal(run / "board" / "cam").shed(alive) is None


CHAT_KV_START, CHAT_KV_END = 64, 400  # MiB of "KV cache" the chat grows through
# what the guest's kernel, the test runner and the two supervisors hold beside the slices (the
# guest boots with 2 GiB; MemTotal less MemAvailable was 201 MiB at the start of a kernel tier
# run, 1964 - 1763: test_psi_shed_warning_guest.py writes it to the results' guest-memory.txt)
GUEST_OS_MIB = 256
BG_FROM_KV = 320  # the job starts when the chat's KV has reached this (most of its growth)
AFTER_SHED_STEPS = 5  # the chat's steps beside the throttled job before it is ended


def _job(mib: int) -> list[str]:
    """A background job that wants `mib` MiB, 16 MiB at a time (~30 MiB/s under TCG: the
    page faults set the pace), then exits 0."""
    return _py(
        f"""
        import time
        chunks = []
        while len(chunks) * 16 < {mib}:
            chunks.append(b"\\x01" * (16 << 20))
            print(f"job touched={{len(chunks) * 16}} MiB", flush=True)
            time.sleep(0.05)
        time.sleep(2)
        """
    )


def _chat_steps(out: Path) -> int:
    return sum(ln.startswith("step ") for ln in out.read_text().splitlines())


def _chat_kv(out: Path) -> int:
    """The chat's KV MiB at its latest step (kvchat.py's --out)."""
    steps = [ln.split() for ln in out.read_text().splitlines() if ln.startswith("step ")]
    return int(steps[-1][2]) if steps else 0


def _stat(group: Path, key: str) -> int:
    return int(cgroups.read_kv(group / "memory.stat")[key])


@pytest.mark.engine(paths=(SMALL,))
@pytest.mark.kernel(controllers=("memory", "pids"), root=True)
def test_board_pressure_sheds_the_job_keeps_the_chat_resident_and_gives_back_after(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    env = _env(tmp_path)
    run = Path(env["GOVERNOR_RUN_DIR"])
    model_mib = SMALL.stat().st_size >> 20
    chat_mib = model_mib + CHAT_KV_END + 40  # + the interpreter
    # the job wants more than the board has beside the chat: bare, something is OOM-killed.
    # Sized from a fixed budget, not MemAvailable: MemAvailable moves with whatever ran before
    # in the guest (alone it is larger, the job larger and slower to reach the board's limit,
    # and the 70 s chat could end first), the guest's MemTotal and the OS's share do not
    bg_mib = ((_meminfo("MemTotal") >> 20) - GUEST_OS_MIB - chat_mib + 250) // 16 * 16
    chat_policy = _policy(
        tmp_path,
        scratch_slice,
        "chat",
        f"""
        [memory]
        min = "{chat_mib}M"
        [qos]
        class = "interactive"
        [[pressure]]
        when = "board memory some 50ms/1s"
        do = ["shed"]
        cooldown = "3s"
        """,
    )
    bg_policy = _policy(
        tmp_path,
        scratch_slice,
        "bg",
        """
        [memory]
        swap_max = "0"
        [qos]
        class = "background"
        yield = ["throttle", "freeze"]
        """,
    )
    out = tmp_path / "chat.out"
    stop = tmp_path / "chat.stop"
    ooms = _oom_kills()
    # up to 70 s of chat: the job (~30 MiB/s under TCG) reached the board's limit 34-49 s after
    # the chat was ready in the runs measured; the shed has to come while the chat still runs.
    # It ends AFTER_SHED_STEPS steps after the throttle (the rest of the 70 s proved nothing
    # more: the job was held, the chat's steps went on)
    chat = _launch(
        chat_policy, env, sys.executable, str(REPO / "tests/helpers/kvchat.py"),
        "--model", str(SMALL), "--out", str(out), "--kv-start", str(CHAT_KV_START),
        "--kv-end", str(CHAT_KV_END), "--grow", "10", "--duration", "70", "--stop", str(stop),
    )  # fmt: skip
    bg: subprocess.Popen[str] | None = None
    chat_group = scratch_slice.path / "chat"
    try:
        _until(lambda: out.exists() and _chat_kv(out) >= BG_FROM_KV, 240, "the chat grown", chat)
        refaults = _stat(chat_group, "workingset_refault_file")
        bg = _launch(bg_policy, env, *_job(bg_mib))
        _until(lambda: "throttle" in _steps(run / "bg"), 240, "the job throttled", chat, bg)
        shed_at = _chat_steps(out)
        _until(
            lambda: _chat_steps(out) >= shed_at + AFTER_SHED_STEPS or "done " in out.read_text(),
            240, "the chat's steps beside the throttled job", chat, bg,
        )  # fmt: skip
        stop.write_text("x")
        _until(lambda: "done " in out.read_text(), 240, "the chat's end", chat, bg)
        refaulted = _stat(chat_group, "workingset_refault_file") - refaults
        chat.wait(timeout=120)
        bg.wait(timeout=300)  # given back when the chat's governor ended: the job completes
    finally:
        for gov in (chat, bg):
            if gov is not None and gov.poll() is None:
                gov.send_signal(signal.SIGTERM)
                gov.wait(timeout=120)
        bg_log = _log(bg_policy) if bg is not None else ""
        for line in _log(chat_policy).splitlines():  # the shed's story, whole
            if any(f'"event": "{e}' in line for e in ("shed", "rule.fired", "engine.exit")):
                print(line[:400])
        print(bg_log[-3000:])
    print(f"chat {_speeds(out)}; its group refaulted {refaulted} pages while the job ran")
    assert _oom_kills() == ooms, "something was OOM-killed"
    assert bg.returncode == 0 and f"touched={bg_mib} MiB" in bg_log, bg_log[-2000:]
    assert chat.returncode == 0
    entries = [e for e in Journal(run / "bg").entries() if e["source"] == "shed"]
    steps = [e["step"] for e in entries]
    assert steps[0] == "throttle" and entries[0]["when"] == "board memory some 50ms/1s", entries
    assert set(steps) <= {"throttle", "freeze", "thaw", "raise", "release"}, steps  # its yield
    assert steps[-1] == "release", steps
    throttled_at = int(entries[0]["changes"][0]["after"])
    assert throttled_at < bg_mib * MIB, "the job was not stopped short of what it wanted"
    # the chat's model stayed in memory: at most a tenth of it was read again
    assert refaulted * 4096 < (model_mib * MIB) // 10, refaulted


def _speeds(out: Path) -> str:
    """Steps/s before the job started and after (printed, never asserted)."""
    lines = [ln.split() for ln in out.read_text().splitlines()]
    t0 = next(float(p[1]) for p in lines if p[0] == "ready")
    steps = [(float(p[1]), int(p[2])) for p in lines if p[0] == "step"]
    before = [t for t, kv in steps if kv < BG_FROM_KV]
    after = [t for t, kv in steps if kv >= BG_FROM_KV]

    def rate(ts: list[float], start: float) -> float:
        return len(ts) / max(1e-9, ts[-1] - start) if ts else 0.0

    alone, beside = rate(before, t0), rate(after, before[-1] if before else t0)
    return f"{alone:.2f} steps/s alone, {beside:.2f} beside the job"
