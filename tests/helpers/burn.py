#!/usr/bin/env python3
"""Burn CPU: ``burn.py --seconds S [--procs N]`` spins N processes (default 1) for S seconds
and prints ``burn pid=P loops=L cpus=[...]`` per process (its allowed CPUs)."""

from __future__ import annotations

import argparse
import os
import sys
import time


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    loops = 0
    while time.monotonic() < end:
        for _ in range(10000):
            pass
        loops += 1
    cpu = os.sched_getaffinity(0)
    print(f"burn pid={os.getpid()} loops={loops} cpus={sorted(cpu)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--procs", type=int, default=1)
    a = p.parse_args(argv)
    kids = []
    for _ in range(a.procs - 1):
        pid = os.fork()
        if pid == 0:
            spin(a.seconds)
            os._exit(0)
        kids.append(pid)
    spin(a.seconds)
    for pid in kids:
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
