"""`governor bench` orchestration: matrix x runs, estimates, outputs, gate (I/O lives here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from governor.bench import metrics
from governor.bench.run import (
    Case,
    Row,
    RunSpec,
    default_log_dir,
    expand_matrix,
    gate,
    plot,
    pyplot,
    run_case,
    to_csv,
    to_json,
)
from governor.bench.sample import cgroup_reader
from governor.engines.budget import estimate_argv
from governor.engines.gguf import read_gguf_cached as read_gguf
from governor.engines.llama import is_gguf, parse_llama_argv
from governor.errors import GovernorError, PolicyNotFound, UsageError
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.parse import parse_meminfo
from governor.log import get_logger
from governor.rundir.state import STATE_FILE, run_dir

log = get_logger(__name__)
DEFAULT_MAX_FRACTION = 0.8  # the seed's evaluation scaffold: peak under 80 % of the board


@dataclass(frozen=True)
class BenchOptions:
    runs: int = 1
    interval: float = 0.1
    models: tuple[str, ...] = ()
    ctxs: tuple[int, ...] = ()
    csv: Path | None = None
    json: Path | None = None
    plot: Path | None = None
    board_bytes: int | None = None  # default: MemTotal
    max_fraction: float = DEFAULT_MAX_FRACTION
    min_decode_tps: float | None = None
    force: bool = False
    log_dir: Path | None = None
    timeout: float | None = None
    drop_caches: bool = False
    metrics_textfile: Path | None = None  # DIR for governor_bench.prom (bench/metrics.py)


@dataclass(frozen=True)
class BenchResult:
    rows: list[Row]
    failures: list[str]
    board_bytes: int


def _global_args(opts: Any) -> tuple[str, ...]:
    out: list[str] = []
    if str(opts.root) != "/":
        out += ["--root", str(opts.root)]
    if opts.cgroup_root is not None:
        out += ["--cgroup-root", str(opts.cgroup_root)]
    return tuple(out)


def _cases(plan: Any, argv: tuple[str, ...], b: BenchOptions) -> list[Case]:
    """The matrix for a llama.cpp engine; a generic engine's argv is run as given (its words
    are not llama.cpp options: `sh -c true` is no context size)."""
    if plan.engine.kind == "llama.cpp":
        return expand_matrix(argv, b.models, b.ctxs)
    if b.models or b.ctxs:
        raise UsageError(
            "--model/--ctx replace llama.cpp's -m/-c: the policy's engine.kind is generic"
            " (--model, --ctx, engine.kind)",
            hint='set [engine] kind = "llama.cpp" in the policy, or drop --model/--ctx',
        )
    return [Case(argv=tuple(argv), model=None, ctx=None)]


def _quant_and_estimate(row: Row, argv: tuple[str, ...], root: Path) -> None:
    """Fill the row's quant and estimate from the GGUF header (when gguf is importable)."""

    args = parse_llama_argv(argv)
    if not is_gguf(args):
        return
    try:
        est = estimate_argv(args, root=root, budget=None)

        row.quant = read_gguf(Path(str(args.model))).quant
    except GovernorError as err:
        log.debug("bench.estimate_unavailable", error=str(err))
        return
    row.estimate_bytes = est.total
    if row.peak_bytes:
        row.estimate_error = round((est.total - row.peak_bytes) / row.peak_bytes, 4)


def bench(
    plan: Any, policy: Path, argv: tuple[str, ...], opts: Any, b: BenchOptions
) -> BenchResult:

    if b.plot is not None:
        pyplot()  # fail before the runs, not after them
    if b.metrics_textfile is not None and not b.metrics_textfile.is_dir():
        raise PolicyNotFound(
            f"no such directory: {b.metrics_textfile} (--metrics-textfile)",
            hint="create it, or give node_exporter's --collector.textfile.directory",
        )
    fs = CgroupFs(Path(plan.cgroup_root))
    launch_args: list[str] = []
    if opts.allow_missing:
        launch_args += ["--allow-missing", ",".join(sorted(opts.allow_missing))]
    if b.force:
        launch_args.append("--force")
    log_dir = b.log_dir or default_log_dir()
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)

    spec = RunSpec(
        state=run_dir() / plan.policy / STATE_FILE,  # the launch publishes the engine's pid
        policy=policy,
        governor_args=_global_args(opts),
        launch_args=tuple(launch_args),
        interval=b.interval,
        log_dir=log_dir,
        timeout=b.timeout,
        drop_caches=b.drop_caches,
    )
    rows: list[Row] = []
    n = 0
    for case in _cases(plan, argv, b):
        for _ in range(b.runs):
            n += 1
            row = run_case(spec, case, n, cgroup_reader(fs, plan.group))
            if plan.engine.kind == "llama.cpp":
                _quant_and_estimate(row, case.argv, opts.root)
            log.info("bench.run", **row.record())
            rows.append(row)
    board = b.board_bytes
    if board is None:
        board = parse_meminfo((opts.root / "proc/meminfo").read_text())["MemTotal"]
    meta = {
        "policy": str(policy),
        "board_bytes": board,
        "max_fraction": b.max_fraction,
        "min_decode_tps": b.min_decode_tps,
        "interval_s": spec.interval,
    }
    if b.csv is not None:
        b.csv.write_text(to_csv(rows))
    if b.json is not None:
        b.json.write_text(to_json(rows, meta) + "\n")
    if b.plot is not None:
        plot(rows, b.plot)
    if b.metrics_textfile is not None:
        metrics.write(b.metrics_textfile, plan.policy, rows)
    failures = gate(
        rows, board_bytes=board, max_fraction=b.max_fraction, min_decode_tps=b.min_decode_tps
    )
    return BenchResult(rows=rows, failures=failures, board_bytes=board)
