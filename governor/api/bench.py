"""`governor bench`: its options checked before any run, then governor/enginebench."""

from __future__ import annotations

import math
from pathlib import Path

from governor.api.host import HostOptions, check
from governor.api.outputs import check_writable
from governor.bench.main import BenchOptions, BenchResult
from governor.bench.main import bench as run_bench
from governor.errors import UsageError


def bench(path: Path, argv: tuple[str, ...], opts: HostOptions, bopts: BenchOptions) -> BenchResult:
    """`governor bench`: run the engine under the policy per governor/bench/main.py."""
    _check_bench_options(bopts)
    plan = check(path, opts)
    return run_bench(plan, path, argv, opts, bopts)


BENCH_INTERVAL_MAX_S = 60.0
BENCH_CTX_MAX = 1 << 24


def _check_bench_options(bopts: BenchOptions) -> None:
    """Refuse what would only fail (or mislead) after every run: NaN or absurd numbers, and
    output files that cannot be written."""
    numbers = {
        "--interval": bopts.interval,
        "--max-peak-fraction": bopts.max_fraction,
        "--min-decode-tps": bopts.min_decode_tps,
        "--timeout": bopts.timeout,
    }
    for option, value in numbers.items():
        if value is not None and (not math.isfinite(value) or value < 0):
            raise UsageError(
                f"{option} {value} is not a finite, non-negative number ({option})",
                hint=f"governor bench --help shows what {option} takes",
            )
    if bopts.interval > BENCH_INTERVAL_MAX_S:
        raise UsageError(
            f"--interval {bopts.interval:g} s samples less than once a minute (--interval)",
            hint="memory is sampled every --interval seconds: 0.05-60",
        )
    for ctx in bopts.ctxs:
        if not 0 < ctx <= BENCH_CTX_MAX:
            raise UsageError(
                f"--ctx {ctx} is not a context size (--ctx)",
                hint=f"a context is 1..{BENCH_CTX_MAX} tokens",
            )
    for option, out in (("--csv", bopts.csv), ("--json", bopts.json), ("--plot", bopts.plot)):
        if out is not None:
            check_writable(out, option)
