#!/usr/bin/env python3
"""Time to first token of real llama.cpp: cold page cache vs governor-prefetched vs warm.

    .venv/bin/python bench/ttft.py [--model PATH] [--repeat 3] [-- EXTRA LLAMA ARGS]

The engine and model are the ones scripts/engine-setup caches (llama-completion and the 1.1 GiB
Qwen-1.8B-shaped GGUF; tests/engine/paths.py). Each run asks for ONE token (`-n 1`), so its wall
time is load + prompt eval + the first token (+ a small teardown): the time to first token.
Runs, each median of --repeat, caches dropped (/proc/sys/vm/drop_caches, root) before the cold
ones:

- ``cold, bare``: the engine alone, cold cache (the baseline);
- ``cold, governor none``: ``governor launch`` without prefetch (the governor's own cost);
- ``cold, governor populate`` / ``lock``: ``governor launch`` with ``[prefetch] mode`` set:
  the model is read in before the engine starts, charged to the slice;
- ``warm, bare``: the engine again, everything cached (the floor).

Needs a cgroup2 hierarchy for ``governor launch`` (the policy sets no limits, so a hierarchy
without the memory controller, like /sys/fs/cgroup/unified on a hybrid host, is enough).
Prints seconds and the ratio to the cold baseline (<1 = faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from engine.paths import BIG, COMPLETION  # noqa: E402

POLICY = """\
name = "ttft-{mode}"
slice = "governor-bench.slice"
[engine]
kind = "llama.cpp"
[prefetch]
mode = "{mode}"
"""


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=BIG)
    ap.add_argument("--engine", type=Path, default=COMPLETION)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="more llama.cpp arguments (after --)")
    a = ap.parse_args(argv)
    engine = [str(a.engine), "-m", str(a.model), "-p", "hello", "-n", "1", "-t", "2",
              "-c", "512", "-no-cnv", "--no-warmup", *a.extra]  # fmt: skip
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="governor-ttft-") as tmp:

        def governor(mode: str) -> list[str]:
            policy = Path(tmp) / f"{mode}.toml"
            policy.write_text(POLICY.format(mode=mode))
            return [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--",
                    *engine]  # fmt: skip

        runs: dict[str, tuple[bool, list[str]]] = {
            "cold, bare engine": (True, engine),
            "cold, governor prefetch=none": (True, governor("none")),
            "cold, governor prefetch=populate": (True, governor("populate")),
            "cold, governor prefetch=lock": (True, governor("lock")),
            "warm, bare engine": (False, engine),
            "warm, governor prefetch=populate": (False, governor("populate")),
        }
        for _ in range(a.repeat):  # interleaved: drift hits every mode alike
            for name, (cold, cmd) in runs.items():
                if cold:
                    drop_caches()
                else:
                    timed(engine)  # make sure it is warm
                results.setdefault(name, []).append(timed(cmd))
    base = statistics.median(results["cold, bare engine"])
    size = a.model.stat().st_size
    print(f"model {a.model} ({size / 2**30:.2f} GiB), `-n 1` wall = time to first token,")
    print(f"median of {a.repeat}; engine argv: {' '.join(engine[1:])}")
    print(f"{'run':36} {'seconds':>8} {'vs cold bare':>12}   all runs")
    for name, times in results.items():
        med = statistics.median(times)
        runs_s = " ".join(f"{t:.2f}" for t in times)
        print(f"{name:36} {med:8.2f} {med / base:12.2f}   {runs_s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
