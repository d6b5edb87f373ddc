#!/usr/bin/env python3
"""Reaction latency to memory pressure, and the monitor's CPU cost, against its peers' models.

    .venv/bin/python -m perf.pressure [--repeat 3] [--cost-seconds 20]   # as root, cgroup2
    .venv/bin/python -m perf.pressure --guest                              # same, in the qemu guest

Latency: a hog grows anon memory in a scratch cgroup whose memory.high is below its working
set (the kernel throttles it: memory stall). From the moment the stall starts (``some total=``
first grows, read every 10 ms) until each watcher reacts:

  trigger    the governor's path: a PSI trigger ``some 150ms/1s`` (governor.monitor.psi.arm), epoll
  total/1s   the governor's fallback: ``total=`` polled once a second, same 150ms-per-1s rule
  avg10/1s   systemd-oomd's model: avg10 polled once a second, acting at >= 15% (the same share)
  avg10/5s   oomd's default interval: avg10 polled every 5 s, >= 15%

Cost: CPU time (getrusage) per second of wall time, over --cost-seconds with a quiet engine,
of the governor's Monitor (3 rules, sampler at 1 s and at 50 ms) and of the seed scaffold's
psutil RSS poller of the engine's process tree at 50 ms. Prints medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from governor.compile.compiler import watch_rule
from governor.errors import GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.parse import parse_psi
from governor.monitor import psi
from governor.monitor.actions.base import Env
from governor.monitor.loop import Monitor
from governor.plan.host import probe
from governor.plan.model import (
    EngineSpec,
    LaunchSpec,
    Plan,
    PrefetchSpec,
    WatchCondition,
    WatchTrigger,
)
from governor.record import replace

REPO = Path(__file__).resolve().parents[1]

HOG = REPO / "tests" / "helpers" / "hog.py"
AVG10_SHARE = 15.0  # percent: 150 ms of stall per 1 s window
TRIGGER = WatchTrigger(
    resource="memory", kind="some", stall_us=150_000, window_us=1_000_000, file="memory.pressure"
)


def _start_in(cgroup: Path, argv: list[str]) -> subprocess.Popen[bytes]:
    procs = str(cgroup / "cgroup.procs")

    def enter() -> None:
        fd = os.open(procs, os.O_WRONLY)
        os.write(fd, b"0")
        os.close(fd)

    return subprocess.Popen(argv, preexec_fn=enter, stdout=subprocess.DEVNULL)  # noqa: PLW1509


def _remove(fs: CgroupFs, name: str, proc: subprocess.Popen[bytes]) -> None:
    fs.kill(name)
    proc.wait()
    for _ in range(100):
        try:
            fs.rmdir(name)
            return
        except GovernorError:  # EBUSY while the killed tasks exit
            time.sleep(0.05)


def _scratch(fs: CgroupFs, name: str, high: str) -> None:
    if "memory" not in fs.subtree_control(""):
        fs.enable("", ["memory"])
    fs.mkdir(name)
    fs.write(name, "memory.high", high)
    fs.write(name, "memory.max", str(1 << 30))


def latency_once(fs: CgroupFs, name: str, timeout: float = 90.0) -> dict[str, float]:
    """Seconds from stall start to each watcher's reaction."""
    _scratch(fs, name, str(48 << 20))
    armed = psi.arm(fs, name, 0, TRIGGER)
    assert armed.fd is not None, "no PSI trigger here"
    poller = psi.PolledTrigger(TRIGGER.stall_us, TRIGGER.window_us)
    ep = select.epoll()
    ep.register(armed.fd, select.EPOLLPRI)
    hog = _start_in(
        fs.path(name),
        [sys.executable, str(HOG), "--mib", "600", "--step-mib", "2", "--interval", "0.02"],
    )
    t0 = time.monotonic()
    reacted: dict[str, float] = {}
    stall_at: float | None = None
    first_total: int | None = None
    next_1s, next_5s = t0 + 1.0, t0 + 5.0
    try:
        while len(reacted) < 4 and time.monotonic() - t0 < timeout:
            if ep.poll(0.01) and "trigger" not in reacted:
                reacted["trigger"] = time.monotonic()
            now = time.monotonic()
            p = parse_psi(fs.read(name, "memory.pressure"))
            if first_total is None:
                first_total = p.some.total
            elif stall_at is None and p.some.total > first_total:
                stall_at = now
            if now >= next_1s:
                next_1s += 1.0
                if "avg10/1s" not in reacted and p.some.avg10 >= AVG10_SHARE:
                    reacted["avg10/1s"] = now
                if "total/1s" not in reacted and poller.update(now, p.some.total):
                    reacted["total/1s"] = now
            if now >= next_5s:
                next_5s += 5.0
                if "avg10/5s" not in reacted and p.some.avg10 >= AVG10_SHARE:
                    reacted["avg10/5s"] = now
    finally:
        ep.close()
        os.close(armed.fd)
        _remove(fs, name, hog)
    if stall_at is None:
        raise SystemExit("bench: the hog never stalled (is memory.high enforced?)")
    return {k: max(0.0, v - stall_at) for k, v in reacted.items()}


def _plan(root: Path, name: str) -> Plan:
    rules = (
        watch_rule(0, TRIGGER, ("log",)),
        watch_rule(1, replace(TRIGGER, kind="full", stall_us=500_000), ("log",)),
        watch_rule(
            2, WatchCondition(condition="event", event="oom_kill", file="memory.events"), ("log",)
        ),
    )
    return Plan(
        policy="bench",
        cgroup_root=str(root),
        slice=name,
        group=name,
        leaf=name,
        create=(name,),
        enable=(),
        writes=(),
        controllers=("memory",),
        launch=LaunchSpec(),
        engine=EngineSpec(),
        prefetch=PrefetchSpec(),
        watch=rules,
    )


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _cost(run: Callable[[float], None], seconds: float) -> float:
    c0, t0 = _cpu(), time.monotonic()
    run(time.monotonic() + seconds)
    return (_cpu() - c0) / (time.monotonic() - t0)


def cost(fs: CgroupFs, name: str, seconds: float) -> dict[str, float]:
    """CPU share of one core for each watcher over ``seconds`` of a quiet engine."""
    _scratch(fs, name, "max")
    engine = _start_in(fs.path(name), ["sleep", "3600"])
    out: dict[str, float] = {}
    try:
        for label, sample_s in (
            ("governor monitor (1 s)", 1.0),
            ("governor monitor (50 ms)", 0.05),
        ):
            env = Env(fs, _plan(fs.root, name), engine_pids=lambda: [engine.pid])
            mon = Monitor(env, sample_s=sample_s)
            mon.start()

            def run(deadline: float, mon: Monitor = mon) -> None:
                mon.run(lambda: time.monotonic() >= deadline)

            out[label] = _cost(run, seconds)
            mon.finish()

        def psutil_poll(deadline: float) -> None:
            proc = psutil.Process(engine.pid)
            while time.monotonic() < deadline:
                rss = proc.memory_info().rss
                for child in proc.children(recursive=True):
                    rss += child.memory_info().rss
                time.sleep(0.05)

        out["psutil RSS poll (50 ms)"] = _cost(psutil_poll, seconds)
    finally:
        _remove(fs, name, engine)
    return out


def in_guest(argv: list[str]) -> int:
    """Run this module in the test guest (virtme-ng, TCG) through the project's harness
    (tests/vm/run.py, the guest scripts/test boots)."""
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "perf.pressure", *argv]
    return subprocess.call([sys.executable, "-m", "vm.run", "--", *cmd], cwd=REPO / "tests")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cost-seconds", type=float, default=20.0)
    ap.add_argument("--guest", action="store_true", help="run in the qemu test guest")
    a = ap.parse_args()
    if a.guest:
        return in_guest([f"--repeat={a.repeat}", f"--cost-seconds={a.cost_seconds}"])
    root = Path(probe().cgroup_mount or sys.exit("bench: no cgroup2 mount"))
    fs = CgroupFs(root)
    name = f"gbench-{os.getpid()}"
    print(f"bench: kernel {os.uname().release}, cgroup2 at {root}, {os.cpu_count()} cpus")
    runs = [latency_once(fs, f"{name}-{i}") for i in range(a.repeat)]
    watchers = ("trigger", "total/1s", "avg10/1s", "avg10/5s")
    med = {w: statistics.median(r[w] for r in runs if w in r) for w in watchers}
    print("\nreaction latency from stall start (s), median of", a.repeat)
    for w in watchers:
        each = " ".join(f"{r.get(w, float('nan')):.2f}" for r in runs)
        ratio = med[w] / med["trigger"] if med["trigger"] > 0 else float("inf")
        print(f"  {w:<10} {med[w]:6.2f}   x{ratio:5.1f} vs trigger   ({each})")
    print(f"\nCPU share of one core, quiet engine, {a.cost_seconds:g}s each")
    shares = cost(fs, f"{name}-cost", a.cost_seconds)
    base = shares["governor monitor (1 s)"]
    for label, share in shares.items():
        ratio = share / base if base > 0 else float("inf")
        print(f"  {label:<26} {share * 100:7.3f}%   x{ratio:6.1f} vs governor (1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
