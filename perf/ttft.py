#!/usr/bin/env python3
"""Time to first token of real llama.cpp: bare vs under the governor, cold and warm page cache.

    .venv/bin/python -m perf.ttft [--model PATH] [--repeat 3] [-- EXTRA LLAMA ARGS]
    cd tests && python -m vm.run -- python -m perf.ttft --repeat 1 -- -nr    # in the guest

The engine and model are the ones scripts/engine-setup caches (llama-completion and the 1.1 GiB
Qwen-1.8B-shaped GGUF; tests/engine/paths.py; GOVERNOR_ENGINE_CACHE moves it). Each run asks
for ONE token (`-n 1`), so its wall time is load + prompt eval + the first token (+ a small
teardown): the time to first token. Runs, interleaved round by round, median of --repeat,
caches dropped (/proc/sys/vm/drop_caches, root) before each cold one:

- ``cold, bare``: the engine alone, cold cache (the baseline);
- ``cold, governor prefetch=none``: ``governor launch`` without prefetch (the governor's cost);
- ``cold, governor prefetch=populate`` / ``lock``: ``governor launch`` with ``[prefetch] mode``
  set: the governor execs the engine at once and its prefetch helper, born in the engine's
  leaf, reads (``lock``: and mlocks) the model ALONGSIDE the engine's own loading, charged to
  the slice (governor/launch/helper.py); the two readers keep the disk busy together;
- ``warm, bare``: the engine again, everything cached (the floor);
- ``warm, governor prefetch=none`` / ``populate``: the governor's cost on a warm cache.

The governor runs as a user runs it: the console script, bytecode compiled (compileall;
PYTHONDONTWRITEBYTECODE unset for the runs), the plan cached by a warm-up launch per mode.
Needs a cgroup2 hierarchy (the policy sets no limits: /sys/fs/cgroup/unified on a hybrid host
is enough; --allow-missing auto passes the controllers it lacks). Prints seconds, the ratio to
the cold and warm bare runs, and the issue's goals: warm governor <= 1.1x warm bare, cold
governor with prefetch <= 1.0x cold bare.
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

from perf._helpers.engine_paths import BIG, COMPLETION
from perf.launch import (
    cgroup_mount,
    compile_governor,
    governor_argv,
    missing_controllers,
    user_env,
)

REPO = Path(__file__).resolve().parents[1]

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


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        check=False,
        env=env,
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
    ap.add_argument("--allow-missing", default="auto", help="auto: what the cgroup2 mount lacks")
    ap.add_argument(
        "--warm-only",
        action="store_true",
        help="skip the cold runs (they drop the page cache of the whole machine)",
    )
    ap.add_argument("extra", nargs="*", help="more llama.cpp arguments (after --)")
    a = ap.parse_args(argv)
    for path in (a.engine, a.model):
        if not path.exists():
            raise SystemExit(f"perf/ttft: {path} missing: run scripts/engine-setup")
    engine = [str(a.engine), "-m", str(a.model), "-p", "hello", "-n", "1", "-t", "2",
              "-c", "512", "-no-cnv", "--no-warmup", *a.extra]  # fmt: skip
    env = user_env()
    compile_governor(env)
    mount = cgroup_mount()
    allow = missing_controllers(mount) if a.allow_missing == "auto" else a.allow_missing
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="governor-ttft-") as tmp:
        env["GOVERNOR_CACHE_DIR"] = str(Path(tmp) / "cache")

        def governor(mode: str) -> list[str]:
            policy = Path(tmp) / f"{mode}.toml"
            policy.write_text(POLICY.format(mode=mode))
            extra = ["--allow-missing", allow] if allow else []
            return [*governor_argv(), "launch", "--policy", str(policy), *extra, "--", *engine]

        runs: dict[str, tuple[bool, list[str]]] = {
            "cold, bare engine": (True, engine),
            "cold, governor prefetch=none": (True, governor("none")),
            "cold, governor prefetch=populate": (True, governor("populate")),
            "cold, governor prefetch=lock": (True, governor("lock")),
            "warm, bare engine": (False, engine),
            "warm, governor prefetch=none": (False, governor("none")),
            "warm, governor prefetch=populate": (False, governor("populate")),
        }
        if a.warm_only:
            runs = {k: v for k, v in runs.items() if not v[0]}
        for _, cmd in runs.values():  # warm-up: the plan cache (one entry per policy + argv)
            timed(cmd, env)
        for _ in range(a.repeat):  # interleaved: drift hits every mode alike
            for name, (cold, cmd) in runs.items():
                if cold:
                    drop_caches()
                else:
                    timed(engine, env)  # make sure it is warm
                results.setdefault(name, []).append(timed(cmd, env))
    cold_bare = statistics.median(results.get("cold, bare engine", [float("nan")]))
    warm_bare = statistics.median(results["warm, bare engine"])
    size = a.model.stat().st_size
    print(f"perf/ttft on {os.uname().nodename}: kernel {os.uname().release}, PID 1"
          f" {Path('/proc/1/comm').read_text().strip()}, {os.cpu_count()} cpus; cgroup2 {mount}")  # fmt: skip
    print(f"model {a.model} ({size / 2**30:.2f} GiB), `-n 1` wall = time to first token,")
    print(f"median of {a.repeat}; engine argv: {' '.join(engine[1:])}")
    print(f"{'run':36} {'seconds':>8} {'/ cold bare':>11} {'/ warm bare':>11}   all runs")
    for name, times in results.items():
        med = statistics.median(times)
        runs_s = " ".join(f"{t:.2f}" for t in times)
        print(f"{name:36} {med:8.2f} {med / cold_bare:11.2f} {med / warm_bare:11.2f}   {runs_s}")

    def ratio(name: str, base: float) -> float:
        return statistics.median(results[name]) / base

    print("goals:")
    for mode in ("none", "populate"):
        r = ratio(f"warm, governor prefetch={mode}", warm_bare)
        print(f"  warm governor prefetch={mode:8} / warm bare  {r:5.2f}  (<= 1.1)")
    for mode in ("populate", "lock") if not a.warm_only else ():
        r = ratio(f"cold, governor prefetch={mode}", cold_bare)
        print(f"  cold governor prefetch={mode:8} / cold bare  {r:5.2f}  (<= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
