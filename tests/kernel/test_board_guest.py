"""Several engines on one board (issue 36) against the real kernel, in the guest (2 GiB, no
swap).

`governor board --json`: its figures are the kernel's files (MemTotal, an applied slice's
memory.min, memory.max and memory.current, an ungoverned top-level cgroup's memory.current).

The issue's scenario, shed before the stall: an interactive engine (tests/helpers/kvchat.py:
every step reads its mmapped model and its KV cache, which grows 150 -> 550 MiB) whose policy
has the PSI shed rules (`memory some 100ms/1s`, `board memory some 100ms/1s`) and the
`board available < headroom` rule, beside a background job (yield throttle and freeze) that
grows to 950 MB, or more when the guest has room for both: bare, something would be OOM-killed.
Measured before this rule: the job shed, then OOM-killed anyway (2 kills), the chat at 0.23x
its solo speed. Here: no OOM kill, the headroom rule took a shed step, the job completes after
the chat, and the chat runs at >= 0.8x its solo speed (steps per second, measured in this test:
the solo run first, then beside the job; a ratio, no time threshold).
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

import pytest
from engine.paths import SMALL
from helpers import cgroups
from helpers.cgroups import ScratchSlice

from governor.board.budget import reserve_for
from governor.rundir.journal import Journal

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
KV_START, KV_END = 150, 550  # the chat's KV cache, MiB (the issue's)
JOB_MB = 950  # the background job's memory at its end (the issue's)
CHAT_S = 24  # seconds of chat steps (its KV grows over the first 12)
SPEED_RATIO = 0.8  # the issue's: the chat beside the job, against its solo speed


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


def _env(tmp_path: Path) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir(mode=0o755, exist_ok=True)
    return {
        **os.environ,
        "GOVERNOR_RUN_DIR": str(run),
        "GOVERNOR_BOARD": str(tmp_path / "no-board.toml"),
    }


def _policy(tmp_path: Path, slice_: ScratchSlice, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nslice = "{slice_.name}"\n' + textwrap.dedent(body))
    return path


def _governor(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "governor", *argv],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


def _launch(policy: Path, env: dict[str, str], *argv: str) -> subprocess.Popen[str]:
    """`governor launch`, its log in POLICY.log (a file: a pipe nobody reads would fill up)."""
    with policy.with_suffix(".log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *argv],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def _until(
    pred: Callable[[], object], timeout: float, what: str, *govs: subprocess.Popen[str]
) -> None:
    def check() -> object:
        for gov in govs:
            assert gov.poll() is None, f"a governor exited with {gov.returncode}: {gov.args!r}"
        return pred()

    cgroups.wait_for(check, timeout, what)


def _py(code: str) -> list[str]:
    return ["/usr/bin/python3", "-c", textwrap.dedent(code)]


@pytest.mark.kernel(controllers=("memory", "pids"), root=True)
def test_board_json_figures_are_the_kernels_files(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    env = _env(tmp_path)
    policy = _policy(
        tmp_path,
        scratch_slice,
        "held",
        """
        [memory]
        min = "96M"
        max = "300M"
        """,
    )
    done = _governor(env, "apply", str(policy))
    assert done.returncode == 0, done.stderr
    # an ungoverned top-level cgroup holding 48 MiB (a container's, say), idle
    holder = scratch_slice.root / f"{scratch_slice.name}-holder"
    holder.mkdir()
    proc = subprocess.Popen(
        _py(
            """
            import sys, time
            b = bytearray(48 << 20)
            b[::4096] = b"x" * len(range(0, 48 << 20, 4096))
            print("held", flush=True)
            time.sleep(600)
            """
        ),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        cgroups.write(holder / "cgroup.procs", proc.pid)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        group = scratch_slice.path / "held"
        before = int(cgroups.read(holder / "memory.current"))
        out = _governor(env, "board", "--json")
        after = int(cgroups.read(holder / "memory.current"))
        assert out.returncode == 0, out.stderr
        v = json.loads(out.stdout)
        memtotal = _meminfo("MemTotal")
        assert (v["memtotal"], v["reserve"]) == (memtotal, reserve_for(memtotal))
        assert v["budget"] == memtotal - reserve_for(memtotal)
        (row,) = [s for s in v["slices"] if s["name"] == "held"]
        assert row["state"] == "running" and row["group"] == f"{scratch_slice.name}/held"
        assert row["min"] == int(cgroups.read(group / "memory.min"))
        assert (row["peak"], row["peak_source"]) == (int(cgroups.read(group / "memory.max")), "max")
        assert row["current"] == int(cgroups.read(group / "memory.current"))
        (other,) = [u for u in v["ungoverned"] if u["cgroup"] == holder.name]
        assert min(before, after) <= other["current"] <= max(before, after)
        assert other["current"] >= 48 * MIB
        assert v["free"]["guarantees"] == v["budget"] - sum(s["min"] for s in v["slices"])
    finally:
        proc.kill()
        proc.wait()
        holder.rmdir()
        _governor(env, "remove", str(policy))


def _job(marks: Path, target: int) -> list[str]:
    """The background job: grows to ``target`` bytes, 8 MiB at a time (touched, anonymous),
    writing its progress; writes its end time (CLOCK_MONOTONIC, kvchat's clock), exits 0."""
    return _py(
        f"""
        import pathlib, time
        marks = pathlib.Path({str(marks)!r})
        target = {target}
        chunks = []
        while len(chunks) * (8 << 20) < target:
            chunks.append(b"\\x01" * (8 << 20))
            (marks / "job").write_text(str(len(chunks) * 8))
            time.sleep(0.05)
        (marks / "job-done").write_text(str(time.monotonic()))
        """
    )


def _chat_argv(out: Path) -> list[str]:
    return [
        sys.executable, str(REPO / "tests/helpers/kvchat.py"), "--model", str(SMALL),
        "--out", str(out), "--kv-start", str(KV_START), "--kv-end", str(KV_END),
        "--grow", str(CHAT_S // 2), "--duration", str(CHAT_S),
    ]  # fmt: skip


def _speed(out: Path) -> tuple[float, float]:
    """(steps per second from ready to the last step, the last step's time)."""
    lines = [ln.split() for ln in out.read_text().splitlines()]
    t0 = next(float(p[1]) for p in lines if p[0] == "ready")
    steps = [float(p[1]) for p in lines if p[0] == "step"]
    assert steps, out.read_text()
    return len(steps) / (steps[-1] - t0), steps[-1]


@pytest.mark.engine(paths=(SMALL,))
@pytest.mark.kernel(controllers=("memory", "pids"), root=True)
def test_headroom_sheds_the_job_before_the_stall_no_oom_and_the_chat_keeps_its_speed(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    env = _env(tmp_path)
    run = Path(env["GOVERNOR_RUN_DIR"])
    marks = tmp_path / "marks"
    marks.mkdir()
    model_mib = SMALL.stat().st_size >> 20
    chat_mib = model_mib + KV_END + 40  # + the interpreter
    chat_policy = _policy(
        tmp_path,
        scratch_slice,
        "chat",
        f"""
        [memory]
        min = "{chat_mib}M"
        max = "{chat_mib + 64}M"   # the peak claim the headroom counts
        swap_max = "0"
        [qos]
        class = "interactive"
        [[pressure]]
        when = "board available < headroom"
        do = ["shed"]
        cooldown = "3s"
        [[pressure]]
        when = "memory some 100ms/1s"
        do = ["shed"]
        cooldown = "3s"
        [[pressure]]
        when = "board memory some 100ms/1s"
        do = ["shed"]
        cooldown = "3s"
        """,
    )
    job_policy = _policy(
        tmp_path,
        scratch_slice,
        "job",
        """
        [memory]
        swap_max = "0"
        [qos]
        class = "background"
        yield = ["throttle", "freeze"]
        """,
    )
    ooms = _oom_kills()
    solo_out = tmp_path / "solo.out"
    solo = _launch(chat_policy, env, *_chat_argv(solo_out))
    assert solo.wait(timeout=300) == 0, chat_policy.with_suffix(".log").read_text()[-3000:]
    solo_speed, _ = _speed(solo_out)
    # the job wants at least the 950 MB, and more than the board has beside the chat
    # at its peak: bare, something would be OOM-killed
    target = max(JOB_MB * 1000 * 1000, _meminfo("MemAvailable") - (chat_mib - 200) * MIB)
    print(f"the job grows to {target >> 20} MiB, the chat to {chat_mib} MiB")
    out = tmp_path / "chat.out"
    job = _launch(job_policy, env, *_job(marks, target))
    chat: subprocess.Popen[str] | None = None
    try:
        _until(
            lambda: (marks / "job").exists() and int((marks / "job").read_text() or 0) >= 256,
            240, "the job's head start", job,
        )  # fmt: skip
        chat = _launch(chat_policy, env, *_chat_argv(out))
        assert chat.wait(timeout=300) == 0, chat_policy.with_suffix(".log").read_text()[-3000:]
        assert job.wait(timeout=300) == 0, job_policy.with_suffix(".log").read_text()[-3000:]
    finally:
        for gov in (chat, job):
            if gov is not None and gov.poll() is None:
                gov.send_signal(signal.SIGTERM)
                gov.wait(timeout=120)
        for line in chat_policy.with_suffix(".log").read_text().splitlines():
            if any(f'"event": "{e}' in line for e in ("shed", "rule.fired")):
                print(line[:300])
    speed, last_step = _speed(out)
    entries = [e for e in Journal(run / "job").entries() if e["source"] == "shed"]
    print(
        f"chat {speed:.2f} steps/s beside the job, {solo_speed:.2f} solo:"
        f" {speed / solo_speed:.2f}x; shed steps {[(e['step'], e['when']) for e in entries]}"
    )
    assert _oom_kills() == ooms, "something was OOM-killed"
    whens = {e["when"] for e in entries if e["step"] in ("throttle", "freeze")}
    assert "board available < headroom" in whens, entries
    assert float((marks / "job-done").read_text()) > last_step, "the job ended before the chat"
    assert speed >= SPEED_RATIO * solo_speed, (speed, solo_speed)
