#!/usr/bin/env python3
"""Read a file through the page cache, or create one.

    pagecache.py FILE [--repeat R] [--hold SEC]   read FILE R times (default 1) in 1 MiB chunks
    pagecache.py --make FILE --mib N              write an N MiB file (non-zero data) and fsync

Prints ``pagecache read=M MiB`` every 64 MiB and ``pagecache done`` at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

MIB = 1 << 20


def make(path: str, mib: int) -> None:
    block = bytes(range(256)) * (MIB // 256)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    print(f"pagecache made {path} {mib} MiB", flush=True)


def read(path: str, repeat: int) -> int:
    total = 0
    for _ in range(repeat):
        with open(path, "rb", buffering=0) as f:
            while True:
                chunk = f.read(MIB)
                if not chunk:
                    break
                total += len(chunk)
                if total % (64 * MIB) == 0:
                    print(f"pagecache read={total // MIB} MiB", flush=True)
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("file", nargs="?")
    p.add_argument("--make", metavar="FILE")
    p.add_argument("--mib", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--hold", type=float, default=0.0, help="sleep after reading")
    a = p.parse_args(argv)
    if a.make:
        if a.mib <= 0:
            p.error("--make needs --mib N")
        make(a.make, a.mib)
        return 0
    if not a.file:
        p.error("FILE or --make FILE --mib N required")
    total = read(a.file, a.repeat)
    print(f"pagecache done read={total // MIB} MiB", flush=True)
    if a.hold > 0:
        time.sleep(a.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
