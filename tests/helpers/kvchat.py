#!/usr/bin/env python3
"""An interactive engine's memory pattern: every step reads the whole mmapped model and the KV
cache, which grows linearly (anonymous memory) while the chat goes on.

    kvchat.py --model FILE --out FILE [--kv-start MIB] [--kv-end MIB] [--grow SEC]
              [--duration SEC] [--stop FILE] [--comm NAME]

Warm-up (not timed): the model is mapped (MAP_SHARED, read-only) and read once, the KV cache
allocated to --kv-start MiB. Then it appends ``ready T0`` to --out (T0: CLOCK_MONOTONIC, the
same clock for every process of the machine) and runs steps for --duration seconds: each step
grows the KV cache towards its size at that moment (--kv-start to --kv-end over --grow
seconds, 4 MiB chunks), reads one byte of every page of the model and of the KV cache, and
appends ``step T KV_MIB``. ``done STEPS`` ends the file, after --duration seconds or, with
--stop, at the first step that finds that file (a test ends the chat once it saw what it
waited for). A page evicted from the model is read again from its file: that is the stall a
step shows.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import sys
import time

MIB = 1 << 20
CHUNK_MIB = 4
PAGE = mmap.PAGESIZE


def set_comm(name: str) -> None:
    """prctl(PR_SET_NAME): the name /proc/PID/comm shows (15 bytes at most)."""
    ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)


def kv_target(elapsed: float, start_mib: int, end_mib: int, grow_s: float) -> int:
    """The KV cache's size (MiB) `elapsed` seconds into the chat."""
    frac = 1.0 if grow_s <= 0 else min(1.0, max(0.0, elapsed / grow_s))
    return round(start_mib + (end_mib - start_mib) * frac)


def new_chunk() -> bytearray:
    b = bytearray(CHUNK_MIB * MIB)
    b[::PAGE] = b"\x01" * len(range(0, len(b), PAGE))  # write: the pages are really there
    return b


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", required=True, help="the file read every step (mmapped)")
    p.add_argument("--out", required=True, help="append ready/step/done lines here")
    p.add_argument("--kv-start", type=int, default=150, help="KV cache MiB at t = 0")
    p.add_argument("--kv-end", type=int, default=550, help="KV cache MiB at t = --grow")
    p.add_argument("--grow", type=float, default=40.0, help="seconds of KV growth")
    p.add_argument("--duration", type=float, default=50.0, help="seconds of steps")
    p.add_argument("--stop", default=None, help="end the steps early once this file exists")
    p.add_argument("--comm", default=None, help="process name (prctl PR_SET_NAME)")
    a = p.parse_args(argv)
    if a.comm:
        set_comm(a.comm)
    fd = os.open(a.model, os.O_RDONLY)
    model = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    os.close(fd)
    weights = memoryview(model)
    kv: list[bytearray] = []
    with open(a.out, "a", buffering=1) as out:
        bytes(weights[::PAGE])
        while len(kv) * CHUNK_MIB < a.kv_start:
            kv.append(new_chunk())
        t0 = time.monotonic()
        print(f"ready {t0:.6f}", file=out)
        steps = 0
        while (now := time.monotonic()) - t0 < a.duration:
            if a.stop is not None and os.path.exists(a.stop):
                break
            while len(kv) * CHUNK_MIB < kv_target(now - t0, a.kv_start, a.kv_end, a.grow):
                kv.append(new_chunk())
            bytes(weights[::PAGE])  # one byte of every page of the model ...
            for chunk in kv:  # ... and of the KV cache (attention reads all of it)
                bytes(memoryview(chunk)[::PAGE])
            steps += 1
            print(f"step {time.monotonic():.6f} {len(kv) * CHUNK_MIB}", file=out)
        print(f"done {steps}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
