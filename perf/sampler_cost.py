#!/usr/bin/env python3
"""Cost of one memory sample: governor bench's cgroup reader vs a psutil poller (the seed's).

    .venv/bin/python -m perf.sampler_cost [--cgroup DIR] [--children 8] [--samples 2000]

Both sample the same workload: this process's children (``sleep`` processes). The cgroup
reader reads memory.current + memory.stat of DIR (as governor/bench/run.py does, one
sample = 2 files); the psutil poller walks the process tree and sums memory_info() (RSS, shared) of each
process, which is what a psutil-based scaffold does. Default DIR: a cgroup2 directory with
memory files (the guest's root), else this process's cgroup v1 memory directory (read-only),
which costs about the same to read. Prints CPU microseconds per sample of each and the ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from governor.kernel.parse import parse_flat_keyed


def _default_cgroup() -> Path:
    for cand in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (cand / "memory.stat").exists() or any(cand.glob("*/memory.current")):
            hit = next((p.parent for p in cand.glob("*/memory.current")), cand)
            return hit
    return Path("/sys/fs/cgroup/memory")  # cgroup v1: memory.usage_in_bytes + memory.stat


def cgroup_sampler(d: Path) -> Callable[[], int]:
    current = d / "memory.current"
    if not current.exists():
        current = d / "memory.usage_in_bytes"
    stat = d / "memory.stat"

    def sample() -> int:
        stat_ = parse_flat_keyed(stat.read_text())  # anon and file, as the bench keeps them
        return int(current.read_text()) + 0 * len(stat_)

    return sample


def psutil_sampler(pid: int) -> Callable[[], int]:
    root = psutil.Process(pid)

    def sample() -> int:
        total = 0
        for p in [root, *root.children(recursive=True)]:
            try:
                m = p.memory_info()
            except psutil.Error:
                continue
            total += m.rss
        return total

    return sample


def cost_us(fn: Callable[[], int], n: int) -> tuple[float, float]:
    fn()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cgroup", type=Path, default=None)
    ap.add_argument("--children", type=int, default=8)
    ap.add_argument("--samples", type=int, default=2000)
    a = ap.parse_args()
    d = a.cgroup or _default_cgroup()
    kids = [subprocess.Popen(["sleep", "600"]) for _ in range(a.children)]
    try:
        cg_cpu, cg_wall = cost_us(cgroup_sampler(d), a.samples)
        ps_cpu, ps_wall = cost_us(psutil_sampler(psutil.Process().pid), a.samples)
    finally:
        for k in kids:
            k.kill()
            k.wait()
    print(f"cgroup reader ({d}): {cg_cpu:8.1f} us CPU, {cg_wall:8.1f} us wall per sample")
    print(
        f"psutil poller ({a.children + 1} processes): {ps_cpu:8.1f} us CPU,"
        f" {ps_wall:8.1f} us wall per sample"
    )
    print(f"ratio psutil/cgroup: CPU {ps_cpu / cg_cpu:.1f}x, wall {ps_wall / cg_wall:.1f}x")
    print(f"at 50 ms: cgroup {cg_cpu / 50e3:.3%} of a core, psutil {ps_cpu / 50e3:.3%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
