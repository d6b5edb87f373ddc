#!/usr/bin/env python3
"""Read a file through the page cache (make one with helpers/disk.py make_file).

    pagecache.py FILE [--repeat R] [--hold SEC]   read FILE R times (default 1) in 1 MiB chunks

Prints ``pagecache read=M MiB`` every 64 MiB and ``pagecache done`` at the end.
"""

from __future__ import annotations

import argparse
import sys
import time

MIB = 1 << 20


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
    p.add_argument("file")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--hold", type=float, default=0.0, help="sleep after reading")
    a = p.parse_args(argv)
    total = read(a.file, a.repeat)
    print(f"pagecache done read={total // MIB} MiB", flush=True)
    if a.hold > 0:
        time.sleep(a.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
