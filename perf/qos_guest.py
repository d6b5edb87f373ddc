"""perf/qos.py's runs in the systemd guest: the workloads under each arm, what each run measures
(the pure parts and the table are in perf/qos_common.py, the command line in perf/qos.py)."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perf.qos_common import (
    BG_COMM,
    CHAT_COMM,
    HELPERS,
    KV_END_MIB,
    REPO,
    SLOW_FACTOR,
    WINDOW_FROM_S,
    Chat,
    Run,
    _fmt,
    bench_policy,
    earlyoom_kills,
    guest_cpu,
    oom_victims,
    parse_chat,
    slow_seconds,
    solo_around,
    step_durations,
    step_speed,
)  # fmt: skip


def log(msg: str) -> None:
    print(f"bench: {msg}", flush=True)


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def cgroup2_root() -> Path:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            return Path(left.split()[4])
    raise SystemExit("bench: no cgroup2 mount")


def read_flat(path: Path) -> dict[str, float]:
    """memory.events (key value) or the `full` line of memory.pressure (key=value)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "full":
                out.update({k: float(v) for k, v in (x.split("=") for x in parts[1:])})
            elif len(parts) == 2:
                out[parts[0]] = float(parts[1])
    return out


TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(comms: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    """(user s, system s, run-queue wait s) of the first process named each of `comms`, in one
    pass over /proc (/proc/PID/stat utime/stime, /proc/PID/schedstat: the time it was runnable
    but another task ran)."""
    out: dict[str, tuple[float, float, float]] = {}
    for d in Path("/proc").iterdir():
        if len(out) == len(comms):
            break
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            comm = (d / "comm").read_text().strip()
            if comm not in comms or comm in out:
                continue
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            wait_ns = int((d / "schedstat").read_text().split()[1])
            out[comm] = (int(stat[11]) / TICK, int(stat[12]) / TICK, wait_ns / 1e9)
    return out


@dataclass
class Times:
    """cpu_of() of the chat and of kswapd0 at the background job's start and at the chat's last
    sample: what the window cost each in CPU, and how long the chat waited for its CPU."""

    start: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    last: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def sample(self, started: bool) -> None:
        for comm, got in cpu_of((CHAT_COMM, "kswapd0")).items():
            if started and comm not in self.start:
                self.start[comm] = got
            if comm in self.start:
                self.last[comm] = got

    def delta(self, comm: str) -> tuple[float, float, float] | None:
        a, b = self.start.get(comm), self.last.get(comm)
        return None if a is None or b is None else (b[0] - a[0], b[1] - a[1], b[2] - a[2])


@dataclass
class Proc:
    """One workload: its process (systemd-run --scope or governor launch) and cgroup."""

    popen: subprocess.Popen[bytes]
    cgroup: Path | None = None
    unit: str | None = None
    events: dict[str, float] = field(default_factory=dict)
    full_us: list[tuple[float, float]] = field(default_factory=list)

    def sample(self) -> None:
        if self.cgroup is None and self.unit is not None:
            rel = sh("systemctl", "show", "-p", "ControlGroup", "--value", self.unit).strip()
            self.cgroup = cgroup2_root() / rel.lstrip("/") if rel else None
        if self.cgroup is None or not self.cgroup.is_dir():
            return
        ev = read_flat(self.cgroup / "memory.events")
        if ev:
            self.events = ev
        full = read_flat(self.cgroup / "memory.pressure").get("total")
        if full is not None:
            self.full_us.append((time.monotonic(), full))


def scope(unit: str, slice_: str, argv: list[str], out: Path, cpus: str | None = None) -> Proc:
    pin = [f"--property=AllowedCPUs={cpus}"] if cpus else []
    cmd = ["systemd-run", "--scope", "--quiet", f"--unit={unit}", f"--slice={slice_}", *pin]
    cmd += argv
    with out.open("ab") as f:
        return Proc(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT), unit=unit)


def governed(policy: Path, argv: list[str], log_: Path, env: dict[str, str]) -> Proc:
    body = tomllib.loads(policy.read_text())
    cg = cgroup2_root() / body["slice"] / body["name"]
    cmd = [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *argv]
    with log_.open("ab") as f:
        popen = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    return Proc(popen, cgroup=cg)


def governor_actions(log_: Path, who: str, victims: bool = False) -> list[str]:
    """`who: ACTION` for each kind of action.done, `who: shed STEP` for each shed step/undo
    (with `victims`, `who: shed STEP VICTIM`: which slice each step took)."""
    seen: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in log_.read_text().splitlines():
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                rec = json.loads(line)
                ev = rec.get("event")
                if ev == "action.done" and rec["action"].split()[0] not in ("log", "shed"):
                    what = rec["action"].split()[0]
                elif ev in ("shed.step", "shed.undo"):
                    what = f"shed {rec['step']}" + (f" {rec['victim']}" if victims else "")
                else:
                    continue
                seen[what] = seen.get(what, 0) + 1
    return [f"{who}: {k}" for k in seen]


@dataclass
class Setup:
    model: Path
    tmp: Path
    chat_s: float
    bg_mib: int
    oomd_limit: str
    oomd_duration: str


def chat_argv(st: Setup, out: Path) -> list[str]:
    return [sys.executable, str(HELPERS / "kvchat.py"), "--model", str(st.model), "--out",
            str(out), "--duration", str(st.chat_s), "--comm", CHAT_COMM]  # fmt: skip


def bg_argv(st: Setup) -> list[str]:
    return [sys.executable, "-u", str(HELPERS / "hog.py"), "--mib", str(st.bg_mib),
            "--step-mib", "16", "--interval", "0.25", "--hold", "5", "--comm", BG_COMM]  # fmt: skip


# the cpu-only arm's job: a busy loop for the chat's measured window, no memory to speak of
SPIN = """import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
print("spin done", flush=True)
"""


def spin_argv(st: Setup) -> list[str]:
    return [sys.executable, "-c", SPIN, str(st.chat_s - WINDOW_FROM_S)]


def cluster(kind: str) -> str | None:
    """The guest's CPUs the bench policies pin "big" or "little" to (perf.qos_common.guest_cpu)."""
    cpus = guest_cpu({"cpu": {"cpus": kind}}, os.cpu_count() or 1).get("cpus")
    return None if cpus is None else str(cpus)


def policies(st: Setup, tag: str, shed: bool) -> tuple[Path, Path]:
    chat = tomllib.loads((REPO / "policies" / "npu-chat.toml").read_text())
    batch = tomllib.loads((REPO / "policies" / "npu-batch.toml").read_text())
    # memory.min protects usage, not pages: it has to cover the chat's working set (its model
    # AND its KV cache at its end, + the interpreter), as an operator sets it, or reclaim takes
    # the model's pages above the protection all the same
    need = (st.model.stat().st_size >> 20) + KV_END_MIB + 16
    cmem = {"min": f"{need}M", "high": f"{need + 150}M", "max": f"{need + 250}M", "swap_max": "0"}
    bmem = {k: batch["memory"][k] for k in ("high", "max")} | {"swap_max": "0"}
    pc, pb = st.tmp / f"chat-{tag}.toml", st.tmp / f"batch-{tag}.toml"
    ncpus = os.cpu_count() or 1
    pc.write_text(bench_policy(chat, "chat", "qosbench.slice", cmem, shed=shed, ncpus=ncpus))
    pb.write_text(bench_policy(batch, "batch", "qosbench.slice", bmem, shed=shed, ncpus=ncpus))
    return pc, pb


def drop_model(model: Path) -> None:
    """The model's clean pages out of the page cache: the chat's warm-up faults them in again,
    charged to its own cgroup (not to a dead one of the previous run)."""
    fd = os.open(model, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def kmsg_now() -> int:
    return len(sh("dmesg").splitlines())


def once(st: Setup, arm: str, seq: int) -> tuple[Run, Chat]:
    """One run of an arm ("solo": the chat alone, bare)."""
    tag = f"{seq}-{arm.replace('+', '')}"
    out, bg_out = st.tmp / f"chat-{tag}.out", st.tmp / f"bg-{tag}.out"
    drop_model(st.model)
    run = Run(arm, seq)
    k0 = kmsg_now()
    extra: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(st.tmp / f"run-{tag}"),
           "GOVERNOR_BOARD": str(st.tmp / "no-board.toml")}  # fmt: skip
    Path(env["GOVERNOR_RUN_DIR"]).mkdir(mode=0o755)
    logs: dict[str, Path] = {}
    if arm == "earlyoom":
        eo_log = st.tmp / f"earlyoom-{tag}.log"
        with eo_log.open("wb") as f:
            extra.append(subprocess.Popen(
                ["earlyoom", "-r", "0", "--prefer", f"^{BG_COMM}$", "--avoid", f"^{CHAT_COMM}$"],
                stdout=f, stderr=subprocess.STDOUT))  # fmt: skip
    if arm in ("governor", "gov+shed"):
        pc, pb = policies(st, tag, shed=arm == "gov+shed")
        logs = {"chat": st.tmp / f"gov-chat-{tag}.log", "batch": st.tmp / f"gov-batch-{tag}.log"}
        chat = governed(pc, chat_argv(st, out), logs["chat"], env)
    else:
        chat_log = st.tmp / f"chat-{tag}.log"
        chat = scope(
            f"qosbench-chat-{tag}.scope", "qosbench_chat.slice", chat_argv(st, out), chat_log,
            cpus=cluster("big"),
        )  # fmt: skip
    bg: Proc | None = None
    cputimes = Times()
    c = Chat()
    ready_by = time.monotonic() + 300
    since = time.time()
    try:
        while (c := parse_chat(out.read_text() if out.exists() else "")).t0 is None:
            if chat.popen.poll() is not None or time.monotonic() > ready_by:
                raise SystemExit(f"bench: {arm}: the chat never got ready ({out})")
            time.sleep(0.2)
        t0 = c.t0
        bg_at = t0 + WINDOW_FROM_S
        end_by = t0 + st.chat_s + 240
        while chat.popen.poll() is None and time.monotonic() < end_by:
            if bg is None and arm != "solo" and time.monotonic() >= bg_at:
                if arm in ("governor", "gov+shed"):
                    bg = governed(pb, bg_argv(st), logs["batch"], env)
                elif arm == "cpu-only":
                    bg = scope(f"qosbench-bg-{tag}.scope", "qosbench_bg.slice", spin_argv(st),
                               bg_out, cpus=cluster("little"))  # fmt: skip
                else:
                    sl = "qosbench_bg_oomd.slice" if arm == "oomd" else "qosbench_bg.slice"
                    bg = scope(f"qosbench-bg-{tag}.scope", sl, bg_argv(st), bg_out,
                               cpus=cluster("little"))  # fmt: skip
            for p in (chat, bg):
                if p is not None:
                    p.sample()
            cputimes.sample(time.monotonic() >= bg_at)  # the window, solo runs too
            time.sleep(0.5)
        if chat.popen.poll() is None:
            log(f"{arm}: the chat still runs {st.chat_s + 240:.0f}s after ready: stopped")
            chat.popen.terminate()
        run.chat_rc = chat.popen.wait()
        if bg is not None:
            bg_by = time.monotonic() + 150
            while bg.popen.poll() is None and time.monotonic() < bg_by:
                bg.sample()
                time.sleep(0.5)
            if bg.popen.poll() is None:
                log(f"{arm}: the background job still runs 150 s after the chat: stopped")
                bg.popen.terminate()
            run.bg_rc = bg.popen.wait()
            text = logs["batch"].read_text() if logs else bg_out.read_text()
            run.bg_done = run.bg_rc == 0 and " done" in text
    finally:
        for p in (chat, bg):
            if p is not None and p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
        for e in extra:
            e.terminate()
            e.wait()
    c = parse_chat(out.read_text())
    times = [t for t, _ in c.steps]
    end = t0 + st.chat_s
    run.speed = step_speed(times, bg_at, end)
    run.window_s = end - bg_at
    run.durations = step_durations(times, bg_at)
    inside = [f for t, f in chat.full_us if bg_at <= t <= end + 1]
    if len(inside) >= 2:
        run.full_s = (inside[-1] - inside[0]) / 1e6
    if (chat_cpu := cputimes.delta(CHAT_COMM)) is not None:
        run.chat_user_s, run.chat_sys_s, run.chat_wait_s = chat_cpu
    if (kswapd := cputimes.delta("kswapd0")) is not None:
        run.kswapd_s = kswapd[0] + kswapd[1]
    victims = oom_victims("\n".join(sh("dmesg").splitlines()[k0:]))
    run.kills += [f"kernel OOM: {v}" for v in victims]
    for who, p in (("chat", chat), ("batch", bg)):
        n = int(p.events.get("oom_kill", 0)) if p is not None else 0
        if n:
            run.kills.append(f"{who} memory.events oom_kill {n}")
    if arm == "earlyoom":
        text = eo_log.read_text()
        if seq < 3:
            log("earlyoom says: " + " | ".join(text.splitlines()[:4]))
        run.kills += earlyoom_kills(text)
    if arm == "oomd":
        j = sh("journalctl", "-u", "systemd-oomd.service", "--no-pager", "-o", "cat",
               f"--since=@{since:.0f}")  # fmt: skip
        for ln in j.splitlines():  # Killed /qosbench_bg_oomd.slice/qosbench-bg-3-oomd.scope due to
            if "Killed" in ln:
                run.kills.append("oomd: batch" if "qosbench-bg" in ln else f"oomd: {ln[:80]}")
    for who, path in logs.items():
        run.actions += governor_actions(path, who)
    log(f"{arm} #{seq}: chat rc {run.chat_rc} speed {run.speed:.2f}/s ({len(times)} steps), "
        f"bg rc {run.bg_rc} done {run.bg_done}, full {_fmt(run.full_s)}s, chat user/sys/wait "
        f"{_fmt(run.chat_user_s)}/{_fmt(run.chat_sys_s)}/{_fmt(run.chat_wait_s)}s, kswapd "
        f"{_fmt(run.kswapd_s)}s, kills {run.kills}, "
        f"actions {run.actions}")  # fmt: skip
    return run, c


def bench(st: Setup, repeat: int, arms: Sequence[str]) -> tuple[list[Run], list[Run]]:
    from perf.oomd import Oomd

    runs: list[Run] = []
    solos: list[Run] = []
    seq = 0
    for r in range(repeat):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for arm in ["solo", *order]:
            try:
                if arm == "oomd":
                    with Oomd(["qosbench_bg_oomd.slice"], st.oomd_limit, st.oomd_duration):
                        run, _ = once(st, arm, seq)
                else:
                    run, _ = once(st, arm, seq)
            except (SystemExit, OSError, subprocess.SubprocessError) as err:
                log(f"{arm} #{seq} failed: {err}")
                run = Run(arm, seq, kills=[f"run failed: {err}"])
            (solos if arm == "solo" else runs).append(run)
            seq += 1
    solos.append(once(st, "solo", seq)[0])
    speeds = [(s.seq, s.speed) for s in solos]
    solo_step = statistics.median([d for s in solos for d in s.durations] or [0.0])
    for run in [*runs, *solos]:
        base = solo_around(speeds, run.seq) if run.arm != "solo" else None
        run.ratio = run.speed / base if base else None
        run.slow_s = slow_seconds(run.durations, solo_step, SLOW_FACTOR) if solo_step else None
    log(f"solo median step {solo_step * 1000:.1f} ms")
    return runs, solos
