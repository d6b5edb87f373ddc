#!/usr/bin/env python3
"""Touch N MiB of anonymous memory, optionally slowly and in several processes.

    hog.py --mib N [--step-mib S --interval SEC] [--hold SEC] [--children K] [--runs FILE]
           [--comm NAME]

Each process (the parent and K forked children) touches N MiB in steps of S MiB, sleeping
SEC between steps, printing ``hog pid=P touched=M MiB`` after each step and ``hog pid=P done``
at the end; then it holds the memory for --hold seconds (default: until killed). The parent
waits for its children; its exit status is non-zero if a child failed or was killed.
With --runs, the parent first appends ``start pid=P`` to FILE (counts relaunches). --comm sets
the process name (/proc/PID/comm, what earlyoom's --prefer matches) before anything is touched.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import sys
import time

MIB = 1 << 20
PAGE = mmap.PAGESIZE


def set_comm(name: str) -> None:
    """prctl(PR_SET_NAME): the name /proc/PID/comm shows (15 bytes at most)."""
    ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)


def touch(mib: int, step_mib: int, interval: float) -> list[mmap.mmap]:
    held: list[mmap.mmap] = []
    done = 0
    while done < mib:
        n = min(step_mib, mib - done)
        m = mmap.mmap(-1, n * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for off in range(0, n * MIB, PAGE):  # one write per page faults it in
            m[off] = 1
        held.append(m)
        done += n
        print(f"hog pid={os.getpid()} touched={done} MiB", flush=True)
        if interval > 0 and done < mib:
            time.sleep(interval)
    return held


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    p.add_argument("--mib", type=int, required=True, help="MiB to touch per process")
    p.add_argument("--step-mib", type=int, default=0, help="MiB per step (default: all at once)")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between steps")
    p.add_argument("--hold", type=float, default=None, help="seconds to hold (default forever)")
    p.add_argument("--children", type=int, default=0, help="forked children that also hog")
    p.add_argument("--runs", default=None, help="append one line per start to this file")
    p.add_argument("--comm", default=None, help="process name (prctl PR_SET_NAME)")
    a = p.parse_args(argv)
    if a.comm:
        set_comm(a.comm)
    if a.runs is not None:
        with open(a.runs, "a") as f:
            f.write(f"start pid={os.getpid()}\n")
    step = a.step_mib if a.step_mib > 0 else a.mib
    kids: list[int] = []
    for _ in range(a.children):
        pid = os.fork()
        if pid == 0:
            kids = []
            break
        kids.append(pid)
    print(f"hog pid={os.getpid()} start mib={a.mib} step={step}", flush=True)
    held = touch(a.mib, step, a.interval)
    print(f"hog pid={os.getpid()} done", flush=True)
    if a.hold is None:
        while True:
            time.sleep(3600)
    time.sleep(a.hold)
    del held
    status = 0
    for pid in kids:
        _, st = os.waitpid(pid, 0)
        if st != 0:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
