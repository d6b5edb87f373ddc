#!/usr/bin/env python3
"""Reaction latency to memory pressure: the real systemd-oomd next to the real governor.

    flock /tmp/governor-guest.lock .venv/bin/python -m perf.oomd --guest [--repeat 3]
    .venv/bin/python -m perf.oomd [--repeat 3]   # as root where systemd is PID 1 (the guest)

--guest boots the systemd test guest (tests/vm, qemu, systemd as PID 1) and runs this script
there. Both watchers see the same workload: tests/helpers/hog.py growing anon memory (600 MiB
in 2 MiB steps every 20 ms) in a cgroup whose memory.high (--high, default 48M) is below its
working set, so the kernel throttles it (memory stall), memory.max 1G, no swap.

  systemd-oomd   `systemd-run --slice=S -p MemoryHigh=... hog.py`; S is a slice unit with
                 ManagedOOMMemoryPressure=kill, ManagedOOMMemoryPressureLimit=--limit (15%),
                 oomd's DefaultMemoryPressureDurationSec=--duration (1s, the smallest it takes)
                 from a drop-in in /run/systemd/oomd.conf.d/; oomd restarted to read it. oomd acts
                 on a descendant of the monitored unit, hence the hog's service in the slice.
  governor       `governor launch --policy P -- hog.py` with memory.high the same and one rule
                 `when = "memory some|full 150ms/1s"`, `do = ["kill"]` (and a `for = "2s"`
                 variant); 150 ms per 1 s is the same 15% share.

Latency: from the moment the stall starts (the hog's cgroup's memory.pressure `some total=`
first grows, read every 10 ms) until the hog's cgroup is empty (cgroup.events populated 0, or
gone). For oomd the journal's "Killed ... due to memory pressure" line is also timed. CPU: the
watcher's own utime+stime (/proc/PID/stat) over that window; for the governor also its whole
process (Python start included) and the report's extra.monitor.sampler.cpu_s. /proc counts
CPU in clock ticks (10 ms here), so a window's figure is coarse.

What oomd compares (systemd 252, src/oom/): the monitored cgroup's memory.pressure `full`
avg10 > limit, polled once a second, held for the duration, plus reclaim activity (pgscan) in
the last 30 s; after a kill it waits 15 s before acting again (repeats are spaced for that).
Everything it writes (the drop-in, slice units) is under /run and removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from governor.kernel.parse import parse_psi
from governor.plan.host import probe

REPO = Path(__file__).resolve().parents[1]

HOG = REPO / "tests" / "helpers" / "hog.py"
OOMD_UNIT = "systemd-oomd.service"
OOMD_DROPIN = Path("/run/systemd/oomd.conf.d/90-governor-bench.conf")
UNIT_DIR = Path("/run/systemd/system")
POST_ACTION_DELAY_S = 15.0  # oomd-manager.h POST_ACTION_DELAY_USEC
POLL_S = 0.01
TICK = os.sysconf("SC_CLK_TCK")

# the governor's rules: (label, `when`, `for` or None)
GOVERNOR_RULES: tuple[tuple[str, str, str | None], ...] = (
    ("governor some 150ms/1s", "memory some 150ms/1s", None),
    ("governor full 150ms/1s", "memory full 150ms/1s", None),
    ("governor full 150ms/1s for 2s", "memory full 150ms/1s", "2s"),
)


def log(msg: str) -> None:
    print(f"bench: {msg}", flush=True)


def sh(*argv: str, check: bool = True) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        raise SystemExit(f"bench: {shlex.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def cgroup2_root() -> Path:
    return Path(probe().cgroup_mount or sys.exit("bench: no cgroup2 mount"))


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of the process (all its threads, not its children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def hog_argv(mib: int) -> list[str]:
    return [sys.executable, "-u", str(HOG), "--mib", str(mib), "--step-mib", "2", "--interval",
            "0.02"]  # fmt: skip


@dataclass(frozen=True)
class Load:
    """The workload and the limits, the same for every watcher."""

    high: str
    mib: int
    timeout: float


@dataclass
class Run:
    watcher: str
    latency: float | None = None  # stall start -> group empty
    cpu_window: float | None = None  # the watcher's CPU seconds over that window
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Watch:
    stall_at: float | None = None
    full_stall_at: float | None = None
    empty_at: float | None = None
    max_full_avg10: float = 0.0
    cpu_at_stall: float | None = None
    cpu_last: float | None = None


def watch(
    cg: Path, cpu: Callable[[], float | None], alive: Callable[[], bool], timeout: float
) -> Watch:
    """Poll the group every 10 ms: stall start (some/full total first grows) and the moment it
    is empty or gone; the watcher's CPU at the stall start and at the last poll."""
    w = Watch()
    base_some: int | None = None
    base_full: int | None = None
    seen = False
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        now = time.monotonic()
        try:
            p = parse_psi((cg / "memory.pressure").read_text())
            populated = "populated 1" in (cg / "cgroup.events").read_text()
        except (OSError, ValueError):
            populated = False
            p = None
        c = cpu()
        if c is not None:
            w.cpu_last = c
        if p is not None:
            if base_some is None:
                base_some = p.some.total
            elif w.stall_at is None and p.some.total > base_some:
                w.stall_at, w.cpu_at_stall = now, c
            if p.full is not None:
                w.max_full_avg10 = max(w.max_full_avg10, p.full.avg10)
                if base_full is None:
                    base_full = p.full.total
                elif w.full_stall_at is None and p.full.total > base_full:
                    w.full_stall_at = now
        seen = seen or populated  # a new group is empty until the engine joins it
        gone = not alive()
        if (seen and not populated) or gone:
            w.empty_at = now if seen else None
            return w
        time.sleep(POLL_S)
    return w


def _finish(run: Run, w: Watch) -> Run:
    if w.stall_at is not None and w.empty_at is not None:
        run.latency = w.empty_at - w.stall_at
    if w.cpu_at_stall is not None and w.cpu_last is not None:
        run.cpu_window = w.cpu_last - w.cpu_at_stall
    run.extra["max_full_avg10"] = w.max_full_avg10
    if w.stall_at is not None and w.full_stall_at is not None:
        run.extra["full_after_some_s"] = round(w.full_stall_at - w.stall_at, 3)
    return run


# ------------------------------------------------------------------------------ systemd-oomd


def unit_prop(unit: str, prop: str) -> str:
    return sh("systemctl", "show", "-p", prop, "--value", unit, check=False).strip()


class Oomd:
    """systemd-oomd configured for the bench (drop-in + slices under /run), restored after."""

    def __init__(self, slices: list[str], limit: str, duration: str) -> None:
        self.slices, self.limit, self.duration = slices, limit, duration
        self.was_active = False
        self.pid = 0

    def __enter__(self) -> Oomd:
        if not Path("/lib/systemd/systemd-oomd").exists():
            raise SystemExit("bench: systemd-oomd is not installed (apt-get install systemd-oomd)")
        self.was_active = unit_prop(OOMD_UNIT, "ActiveState") == "active"
        OOMD_DROPIN.parent.mkdir(parents=True, exist_ok=True)
        OOMD_DROPIN.write_text(f"[OOM]\nDefaultMemoryPressureDurationSec={self.duration}\n")
        UNIT_DIR.mkdir(parents=True, exist_ok=True)
        for s in self.slices:
            (UNIT_DIR / s).write_text(
                "[Unit]\nDescription=governor bench: monitored by systemd-oomd\n[Slice]\n"
                f"ManagedOOMMemoryPressure=kill\nManagedOOMMemoryPressureLimit={self.limit}\n"
            )
        for u in (OOMD_UNIT, "systemd-oomd.socket"):
            if unit_prop(u, "LoadState") == "masked":
                log(f"{u} is masked: unmasking (runtime)")
                sh("systemctl", "unmask", "--runtime", u, check=False)
                if unit_prop(u, "LoadState") == "masked":
                    sh("systemctl", "unmask", u, check=False)
        sh("systemctl", "daemon-reload")
        r = subprocess.run(
            ["systemctl", "restart", OOMD_UNIT], capture_output=True, text=True, check=False
        )
        if r.returncode != 0 or unit_prop(OOMD_UNIT, "ActiveState") != "active":
            print(sh("systemctl", "status", "--no-pager", "-l", OOMD_UNIT, check=False))
            print(sh("journalctl", "-b", "--no-pager", "-n", "60", "-u", OOMD_UNIT,
                     "-u", "systemd-oomd.socket", check=False))  # fmt: skip
            raise SystemExit(f"bench: systemd-oomd does not start: {r.stderr.strip()}")
        self.pid = int(unit_prop(OOMD_UNIT, "MainPID") or 0)
        log(f"systemd-oomd {sh('systemctl', '--version').split()[1]} running, pid {self.pid}")
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            OOMD_DROPIN.unlink()
        for s in self.slices:
            with contextlib.suppress(OSError):
                (UNIT_DIR / s).unlink()
        sh("systemctl", "daemon-reload", check=False)
        action = "restart" if self.was_active else "stop"
        sh("systemctl", action, OOMD_UNIT, check=False)

    def cpu(self) -> float | None:
        return cpu_seconds(self.pid)

    def dump(self) -> str:
        return sh("oomctl", "dump", check=False) or sh("oomctl", check=False)


def journal_kills(since_epoch: float) -> list[tuple[float, str]]:
    """(CLOCK_MONOTONIC seconds, message) of oomd's kill lines since the given wall time."""
    out = sh("journalctl", "-u", OOMD_UNIT, "-o", "json", "--no-pager",
             f"--since=@{since_epoch:.0f}", check=False)  # fmt: skip
    found = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            rec = json.loads(line)
            msg = rec["MESSAGE"]
            if isinstance(msg, str) and "Killed" in msg and "memory pressure" in msg:
                found.append((int(rec["__MONOTONIC_TIMESTAMP"]) / 1e6, msg))
    return found


def oomd_once(oomd: Oomd, i: int, slice_: str, load: Load) -> Run:
    unit = f"governor-bench-hog{i}.service"
    since = time.time() - 1
    sh("systemd-run", "--quiet", "--collect", f"--unit={unit}", f"--slice={slice_}",
       "-p", f"MemoryHigh={load.high}", "-p", "MemoryMax=1G", "-p", "MemorySwapMax=0",
       "--", *hog_argv(load.mib))  # fmt: skip
    cg_rel = unit_prop(unit, "ControlGroup").lstrip("/")
    if not cg_rel:
        raise SystemExit(f"bench: {unit} has no control group: {unit_prop(unit, 'ActiveState')}")
    cg = cgroup2_root() / cg_rel
    run = Run("systemd-oomd")
    if i == 0:
        dump = oomd.dump()
        print(textwrap.indent(dump.strip(), "  oomctl| "), flush=True)
        if slice_ not in dump:
            log(f"WARNING: oomctl does not list {slice_} as monitored")
    w = watch(cg, oomd.cpu, lambda: True, load.timeout)
    run = _finish(run, w)
    if w.empty_at is None:
        slice_cg = cg.parent
        with contextlib.suppress(OSError):
            stat = (slice_cg / "memory.stat").read_text().split("\n")
            run.extra["slice_pgscan"] = [s for s in stat if s.startswith("pgscan ")]
            run.extra["slice_pressure"] = (slice_cg / "memory.pressure").read_text().strip()
        sh("systemctl", "stop", unit, check=False)
        run.extra["journal"] = sh("journalctl", "-u", OOMD_UNIT, "--no-pager",
                                  f"--since=@{since:.0f}", check=False).strip()[-2000:]  # fmt: skip
        log(f"systemd-oomd did not act within {load.timeout:.0f}s: {run.extra}")
        return run
    time.sleep(0.5)  # let the line reach the journal
    kills = journal_kills(since)
    if kills and w.stall_at is not None:
        run.extra["journal_latency"] = kills[-1][0] - w.stall_at
        run.extra["journal"] = kills[-1][1]
    else:
        run.extra["journal"] = "(no 'Killed ... due to memory pressure' line: not oomd?)"
    run.extra["result"] = unit_prop(unit, "Result")
    run.extra["killed_at"] = w.empty_at
    return run


# ------------------------------------------------------------------------------ governor


def _fired_at(errlog: Path) -> float | None:
    """CLOCK_MONOTONIC time of the first `rule.fired` in the governor's JSON log (its wall-clock
    timestamp mapped through the current offset between the two clocks)."""
    offset = time.time() - time.monotonic()
    for line in errlog.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            rec = json.loads(line)
            if rec.get("event") == "rule.fired":
                stamp = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00"))
                return stamp.timestamp() - offset
    return None


def governor_once(tmp: Path, tag: str, rule: tuple[str, str, str | None], load: Load) -> Run:
    label, when, hold = rule
    slice_ = f"governor-bench-{os.getpid()}-{tag}.slice"
    policy = tmp / f"gov-{tag}.toml"
    report = tmp / f"gov-{tag}.json"
    errlog = tmp / f"gov-{tag}.log"
    body = f'name = "eng"\nslice = "{slice_}"\n'
    body += f'[memory]\nhigh = "{load.high}"\nmax = "1G"\nswap_max = "0"\n'
    body += f'[[pressure]]\nwhen = "{when}"\n'
    if hold:
        body += f'for = "{hold}"\n'
    body += 'do = ["kill"]\n'
    policy.write_text(body)
    run = Run(label)
    with errlog.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "governor", "launch", "--policy", str(policy),
             "--report", str(report), "--", *hog_argv(load.mib)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        cg = cgroup2_root() / slice_ / "eng"
        deadline = time.monotonic() + 120
        while not (cg / "memory.pressure").exists() and proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        w = watch(cg, lambda: cpu_seconds(proc.pid), lambda: proc.poll() is None, load.timeout)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.terminate()
            rc = proc.wait()
    run = _finish(run, w)
    fired = _fired_at(errlog)
    if fired is not None and w.stall_at is not None:
        run.extra["fired_latency"] = fired - w.stall_at
    run.extra["exit"] = rc
    run.extra["cpu_process"] = w.cpu_last
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        mon = json.loads(report.read_text())["extra"]["monitor"]
        run.extra["sampler_cpu_s"] = mon["sampler"]["cpu_s"]
        run.extra["psi_mode"] = mon["psi"][0].get("mode")
        if mon["firings"]:
            run.extra["fired_t_s"] = mon["firings"][0]["t_s"]
    if run.latency is None or rc != 128 + 9:
        tail = errlog.read_text().splitlines()[-15:]
        log(f"{label}: exit {rc}, latency {run.latency}; governor log tail:\n" + "\n".join(tail))
    return run


# ------------------------------------------------------------------------------ main


def _fmt(x: float | None, unit: float = 1.0, nd: int = 2) -> str:
    return "-" if x is None else f"{x * unit:.{nd}f}"


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def table(
    runs: list[Run], watchers: list[str], oomd_conf: str, oomd_cpu: tuple[float, float]
) -> str:
    med = {w: _median([r.latency for r in runs if r.watcher == w]) for w in watchers}
    base = med.get("systemd-oomd")
    lines = [
        "",
        f"reaction latency, stall start -> hog's cgroup empty (s); {oomd_conf}",
        f"{'watcher':<36} {'median':>7} {'x oomd':>7}  {'runs':<30} {'CPU in window (ms)':>18}",
    ]
    for w in watchers:
        rs = [r for r in runs if r.watcher == w]
        each = " ".join(_fmt(r.latency) for r in rs)
        m = med[w]
        ratio = "-" if m is None or not base else f"{m / base:.2f}"
        cpu = _median([r.cpu_window for r in rs])
        lines.append(f"{w:<36} {_fmt(m):>7} {ratio:>7}  {each:<30} {_fmt(cpu, 1000, 1):>18}")
    oo = [r for r in runs if r.watcher == "systemd-oomd"]
    jl = [r.extra.get("journal_latency") for r in oo]
    each = " ".join(_fmt(x) for x in jl)
    lines.append(f"{'  oomd: journal kill line':<36} {_fmt(_median(jl)):>7} {'':>7}  {each}")
    for w in watchers[1:]:
        fl = [r.extra.get("fired_latency") for r in runs if r.watcher == w]
        each = " ".join(_fmt(x) for x in fl)
        label = "  " + w.removeprefix("governor ") + ": rule.fired"
        lines.append(f"{label:<36} {_fmt(_median(fl)):>7} {'':>7}  {each}")
    lines.append("")
    cpu_s, wall = oomd_cpu
    lines.append(
        f"systemd-oomd process CPU over the whole bench: {cpu_s:.3f}s in {wall:.0f}s wall = "
        f"{cpu_s / wall * 100 if wall else 0:.3f}% of a core (it polls all the time)"
    )
    for w in watchers[1:]:
        rs = [r for r in runs if r.watcher == w]
        proc = _median([r.extra.get("cpu_process") for r in rs])
        samp = _median([r.extra.get("sampler_cpu_s") for r in rs])
        lines.append(
            f"{w}: process CPU per launch {_fmt(proc, 1, 3)}s (Python start included), "
            f"sampler cpu_s {_fmt(samp, 1, 4)}"
        )
    return "\n".join(lines)


def in_guest(argv: list[str], timeout: float) -> int:
    """Run this module in the systemd guest through the project's harness (tests/vm/run.py)."""
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "perf.oomd", *argv]
    harness = [sys.executable, "-m", "vm.run", "--guest", "systemd", f"--timeout={timeout}"]
    return subprocess.call([*harness, "--", *cmd], cwd=REPO / "tests")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--high", default="48M", help="memory.high / MemoryHigh= of the hog's group")
    ap.add_argument("--mib", type=int, default=600, help="the hog's working set (MiB)")
    ap.add_argument("--limit", default="15%", help="ManagedOOMMemoryPressureLimit=")
    ap.add_argument("--duration", default="1s", help="oomd DefaultMemoryPressureDurationSec=")
    ap.add_argument("--timeout", type=float, default=120.0, help="per run, from the hog start")
    ap.add_argument("--no-governor", action="store_true", help="only systemd-oomd")
    ap.add_argument("--json", type=Path, default=None, help="also write the runs here")
    ap.add_argument("--guest", action="store_true", help="run in the systemd test guest")
    ap.add_argument("--guest-timeout", type=float, default=3000.0)
    a = ap.parse_args()
    if a.guest:
        inner = [x for x in sys.argv[1:] if x != "--guest"]
        return in_guest(inner, a.guest_timeout)
    if os.geteuid() != 0 or Path("/proc/1/comm").read_text().strip() != "systemd":
        raise SystemExit("bench: needs root and systemd as PID 1 (use --guest)")
    log(f"kernel {os.uname().release}, {os.cpu_count()} cpus, cgroup2 at {cgroup2_root()}")
    slices = [f"governor_bench_oomd{i}.slice" for i in range(a.repeat)]
    watchers = ["systemd-oomd"] + ([] if a.no_governor else [r[0] for r in GOVERNOR_RULES])
    runs: list[Run] = []
    load = Load(a.high, a.mib, a.timeout)
    with Oomd(slices, a.limit, a.duration) as oomd, tempfile.TemporaryDirectory() as tmpd:
        conf = (f"oomd: full avg10 > {a.limit} for >= {a.duration}, "
                f"ManagedOOMMemoryPressure=kill on the slice, polled every 1 s")  # fmt: skip
        c0, t0 = oomd.cpu() or 0.0, time.monotonic()
        last_kill = 0.0
        for i in range(a.repeat):
            wait = last_kill + POST_ACTION_DELAY_S + 1 - time.monotonic()
            if wait > 0:
                log(f"waiting {wait:.1f}s: oomd's post-action delay")
                time.sleep(wait)
            r = oomd_once(oomd, i, slices[i], load)
            last_kill = float(r.extra.get("killed_at", time.monotonic()))
            log(f"round {i}: systemd-oomd {_fmt(r.latency)}s, {r.extra.get('journal')}")
            runs.append(r)
            if a.no_governor:
                continue
            for k, rule in enumerate(GOVERNOR_RULES):
                g = governor_once(Path(tmpd), f"{i}-{k}", rule, load)
                log(f"round {i}: {g.watcher} {_fmt(g.latency)}s, exit {g.extra.get('exit')}, "
                    f"fired at t={g.extra.get('fired_t_s')}")  # fmt: skip
                runs.append(g)
        oomd_cpu = ((oomd.cpu() or 0.0) - c0, time.monotonic() - t0)
    print(table(runs, watchers, conf, oomd_cpu), flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps([r.__dict__ for r in runs], indent=1, default=str))
    return 0 if all(r.latency is not None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
