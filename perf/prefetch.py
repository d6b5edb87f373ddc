#!/usr/bin/env python3
"""Cold-cache time until a file is 100% resident: each governor prefetch method vs its peers.

    .venv/bin/python -m perf.prefetch [--file PATH] [--mib 1024] [--repeat 3]

Peers in the same run: ``cat FILE > /dev/null``, ``vmtouch -t FILE`` (apt package vmtouch) and
``dd iflag=direct bs=4M`` (the device's physical limit: it bypasses the page cache, so its
"resident" column stays ~0). Caches are dropped (``/proc/sys/vm/drop_caches``, root) before every
run. Prints the median of each and its throughput relative to dd and to vmtouch. The governor's
methods run in this process (no cgroup needed for the raw comparison); "lock" = populate plus an
mlock of the whole file, as the locker does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from governor.launch import prefetch as pf

MIB = 1 << 20
ADVISE_WAIT_S = 60.0


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def residency(path: Path) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        return pf.resident_fraction(pf.Prefetcher().residency(fd, os.fstat(fd).st_size))
    finally:
        os.close(fd)


def wait_resident(path: Path) -> None:
    deadline = time.monotonic() + ADVISE_WAIT_S
    while residency(path) < 1.0 and time.monotonic() < deadline:
        time.sleep(0.01)


def governor_method(method: pf.Method) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        p = pf.Prefetcher()
        size = path.stat().st_size
        fd = os.open(path, os.O_RDONLY)
        try:
            for off, n in pf._chunks(size, pf.CHUNK):
                p._fill(method, fd, off, n)
        finally:
            os.close(fd)
        if method == "fadvise_willneed":  # a hint: wait until the read-ahead landed
            wait_resident(path)

    return run


def governor_mode(mode: pf.Mode) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        pf.Prefetcher().run([path], mode, tty=None)
        if mode == "advise":  # a hint: the clock runs until the read-ahead landed
            wait_resident(path)
        if mode == "lock":
            libc = pf._Libc()
            fd = os.open(path, os.O_RDONLY)
            size = os.fstat(fd).st_size
            addr = libc.map(fd, 0, size)
            libc.lock(addr, size)
            libc.unmap(addr, size)
            os.close(fd)

    return run


def shell(argv: list[str]) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        cmd = [a.replace("{file}", str(path)) for a in argv]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--file", type=Path, default=Path("/var/tmp/governor-bench-prefetch.bin"))
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    if not a.file.exists() or a.file.stat().st_size != a.mib * MIB:
        with open(a.file, "wb") as f:
            block = os.urandom(MIB)
            for _ in range(a.mib):
                f.write(block)
    size = a.file.stat().st_size
    runs: dict[str, Callable[[Path], None]] = {
        "governor advise (until resident)": governor_mode("advise"),
        "governor populate": governor_mode("populate"),
        "governor lock (populate+mlock)": governor_mode("lock"),
        "  method madv_populate_read": governor_method("madv_populate_read"),
        "  method map_populate": governor_method("map_populate"),
        "  method read loop": governor_method("read"),
        "  method fadvise (waited)": governor_method("fadvise_willneed"),
        "cat > /dev/null": shell(["sh", "-c", "cat '{file}' > /dev/null"]),
        "dd iflag=direct bs=4M": shell(
            ["dd", "if={file}", "of=/dev/null", "bs=4M", "iflag=direct"]
        ),
    }
    if shutil.which("vmtouch"):
        runs["vmtouch -t"] = shell(["vmtouch", "-qt", "{file}"])
    else:
        print("vmtouch not installed (apt-get install vmtouch): skipped", file=sys.stderr)
    results: dict[str, tuple[float, float]] = {}
    for name, fn in runs.items():
        times, res = [], []
        for _ in range(a.repeat):
            drop_caches()
            t0 = time.perf_counter()
            fn(a.file)
            times.append(time.perf_counter() - t0)
            res.append(residency(a.file))
        results[name] = (statistics.median(times), statistics.median(res))
    dd = results["dd iflag=direct bs=4M"][0]
    vmt = results.get("vmtouch -t", (None, 0.0))[0]
    print(f"file {a.file} {size / MIB:.0f} MiB, median of {a.repeat}, cold cache each run")
    print(
        f"{'method':36} {'seconds':>8} {'GB/s':>6} {'resident':>9} {'vs dd':>6} {'vs vmtouch':>10}"
    )
    for name, (t, r) in results.items():
        vs_vmt = f"{vmt / t:10.2f}" if vmt else f"{'-':>10}"
        print(f"{name:36} {t:8.3f} {size / t / 1e9:6.2f} {r * 100:8.1f}% {dd / t:6.2f} {vs_vmt}")
    print("ratios are throughput relative to the peer (>1 = faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
