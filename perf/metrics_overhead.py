"""perf/metrics_overhead: what serving /metrics costs the supervisor while an engine runs.

    python -m perf.metrics_overhead [--runs 3] [--window 10] [--interval 1] [--settle 2]

Interleaved rounds of two launches, each measured alone: `governor launch --policy P -- sleep S`
and the same with `--metrics 127.0.0.1:PORT`, scraped every --interval seconds by this bench
(P = perf/launch.py's policy, three [[pressure]] PSI rules). For each, --settle seconds after
the engine started (imports done, triggers armed), the supervisor's CPU time (utime + stime of
all its threads, /proc/PID/stat) is taken over --window seconds, then its memory
(/proc/PID/smaps_rollup: PSS, USS, RSS). The watchdog and the engine are not counted. Prints
the medians, the scrape latency and the ratios with/without. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from perf.footprint import MiB, descendants, exe, rollup
from perf.launch import (
    POLICY,
    compile_governor,
    governor_argv,
    missing_controllers,
    user_env,
)
from perf.launch import cgroup_mount as find_cgroup_mount

REPO = Path(__file__).resolve().parents[1]

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scraper(threading.Thread):
    """GET url every ``interval`` s until stopped; keeps each scrape's latency and size."""

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.size = 0
        self.errors = 0

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    self.size = len(r.read())
                self.latencies.append(time.monotonic() - t0)
            except OSError:
                self.errors += 1
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))


def measure(
    argv: list[str], env: dict[str, str], engine_exe: str, a: argparse.Namespace, url: str | None
) -> dict[str, float]:
    proc = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    scraper = Scraper(url, a.interval) if url else None
    try:
        deadline = time.monotonic() + 60
        while not any(exe(d) == engine_exe for d in descendants(proc.pid)):
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise SystemExit(f"perf/metrics_overhead: no engine under {argv}\n{err[-3000:]}")
            time.sleep(0.01)
        if scraper is not None:
            scraper.start()
        time.sleep(a.settle)
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(a.window)
        c1, t1 = cpu_seconds(proc.pid), time.monotonic()
        mem = rollup(proc.pid)
    finally:
        if scraper is not None:
            scraper.stop.set()
            scraper.join()
        proc.terminate()
        proc.communicate(timeout=60)
    out = {
        "cpu_ms_per_s": (c1 - c0) / (t1 - t0) * 1000,
        "pss": mem["Pss"],
        "uss": mem["Uss"],
        "rss": mem["Rss"],
    }
    if scraper is not None:
        out["scrapes"] = len(scraper.latencies)
        out["errors"] = scraper.errors
        out["latency_ms"] = statistics.median(scraper.latencies) * 1000 if scraper.latencies else 0
        out["bytes"] = scraper.size
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--window", type=float, default=10.0, help="seconds of CPU measured")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after the engine starts")
    p.add_argument("--allow-missing", default="auto")
    a = p.parse_args()

    env = user_env()
    env.pop("GOVERNOR_METRICS", None)
    compile_governor(env)
    mount = find_cgroup_mount()
    allow = missing_controllers(mount) if a.allow_missing == "auto" else a.allow_missing
    sleep = shutil.which("sleep") or "/bin/sleep"
    hold = f"{a.settle + a.window + 30:g}"  # ended by SIGTERM after the window
    tmp = Path(tempfile.mkdtemp(prefix="bench-metrics."))
    env["GOVERNOR_CACHE_DIR"] = str(tmp / "cache")
    env["GOVERNOR_RUN_DIR"] = str(tmp / "run")
    try:
        policy = tmp / "p.toml"
        policy.write_text(POLICY)
        extra = ["--allow-missing", allow] if allow else []
        base = [*governor_argv(), "launch", "--policy", str(policy), *extra]
        print(
            f"perf/metrics_overhead on {os.uname().nodename}: kernel {os.uname().release},"
            f" load {os.getloadavg()[0]:.2f}; cgroup2 {mount}; --allow-missing {allow or '-'}"
        )
        print(
            f"  {a.runs} rounds; CPU over {a.window:g} s from {a.settle:g} s after the engine"
            f" started; scraped every {a.interval:g} s"
        )
        subprocess.run([*base, "--", "true"], env=env, check=True, capture_output=True)
        rows: dict[str, list[dict[str, float]]] = {"plain": [], "metrics": []}
        for _ in range(a.runs):
            rows["plain"].append(
                measure([*base, "--", sleep, hold], env, os.path.realpath(sleep), a, None)
            )
            port = free_port()
            argv = [*base, "--metrics", f"127.0.0.1:{port}", "--", sleep, hold]
            url = f"http://127.0.0.1:{port}/metrics"
            rows["metrics"].append(measure(argv, env, os.path.realpath(sleep), a, url))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(name: str, key: str) -> float:
        return statistics.median(r.get(key, 0) for r in rows[name])

    print(f"\nmedians             {'CPU ms/s':>9} {'PSS MiB':>8} {'USS MiB':>8} {'RSS MiB':>8}")
    for name in rows:
        print(
            f"  {name:17} {med(name, 'cpu_ms_per_s'):9.2f} {med(name, 'pss') / MiB:8.2f}"
            f" {med(name, 'uss') / MiB:8.2f} {med(name, 'rss') / MiB:8.2f}"
        )
    print(
        f"  scrapes per window {med('metrics', 'scrapes'):.0f} (errors {med('metrics', 'errors'):.0f}),"
        f" latency {med('metrics', 'latency_ms'):.1f} ms, {med('metrics', 'bytes'):.0f} bytes"
    )
    cpu0, cpu1 = med("plain", "cpu_ms_per_s"), med("metrics", "cpu_ms_per_s")
    per_scrape = (cpu1 - cpu0) * a.interval
    print(
        f"\nserving costs {cpu1 - cpu0:.2f} ms of CPU per second, ~{per_scrape:.1f} ms per scrape"
    )
    print(f"  (CPU is read in clock ticks: {1000 / TICK:.0f} ms over a {a.window:g} s window)")
    print("ratios, --metrics / plain")
    print(f"  CPU  {cpu1 / cpu0:.2f}x" if cpu0 else "  CPU  - (plain rounds to 0 ticks)")
    for key in ("pss", "uss", "rss"):
        print(f"  {key.upper()}  {med('metrics', key) / med('plain', key):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
