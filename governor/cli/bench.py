"""`governor bench`: what the engine costs under a policy (governor/bench/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from governor.cli.complete import complete_policy_file
from governor.cli.options import BOARD_FLOOR, AllowMissing, Force, host_options, size_option
from governor.cli.render import show_bench


def bench(  # noqa: PLR0917  # typer passes every option as a parameter
    policy: Annotated[
        Path,
        typer.Option(
            "--policy", "-p", help="policy TOML file", autocompletion=complete_policy_file
        ),
    ],
    engine: Annotated[list[str], typer.Argument(help="the engine command after --")],
    runs: Annotated[int, typer.Option("--runs", "-n", help="runs per configuration", min=1)] = 1,
    interval: Annotated[
        float, typer.Option("--interval", help="memory sample interval, seconds", min=0.05)
    ] = 0.1,
    model: Annotated[
        list[str] | None, typer.Option("--model", help="matrix: replace -m (repeatable)")
    ] = None,
    ctx: Annotated[
        list[int] | None, typer.Option("--ctx", help="matrix: replace -c (repeatable)")
    ] = None,
    csv_out: Annotated[Path | None, typer.Option("--csv", help="write one row per run")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="rows + series")] = None,
    plot_out: Annotated[
        Path | None, typer.Option("--plot", help="PNG of memory over time (needs [plot])")
    ] = None,
    board_memory: Annotated[
        str | None, typer.Option("--board-memory", help="board RAM (default MemTotal)")
    ] = None,
    max_peak_fraction: Annotated[
        float, typer.Option("--max-peak-fraction", help="gate: peak / board memory", min=0.0)
    ] = 0.8,
    min_decode_tps: Annotated[
        float | None, typer.Option("--min-decode-tps", help="gate: decode tokens/s floor")
    ] = None,
    allow_missing: AllowMissing = "",
    force: Force = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="seconds per run before giving up")
    ] = None,
    drop_caches: Annotated[
        bool, typer.Option("--drop-caches", help="cold page cache before each run (root)")
    ] = False,
    metrics_textfile: Annotated[
        Path | None,
        typer.Option(
            "--metrics-textfile",
            help="write DIR/governor_bench.prom (node_exporter textfile) with the rows",
        ),
    ] = None,
) -> None:
    """Run an engine under a policy N times: memory peak/samples, tokens/s, CSV/JSON, CI gate."""
    from governor.api import bench as api_bench
    from governor.bench.main import BenchOptions

    result = api_bench.bench(
        policy,
        tuple(engine),
        host_options(allow_missing),
        BenchOptions(
            runs=runs,
            interval=interval,
            models=tuple(model or ()),
            ctxs=tuple(ctx or ()),
            csv=csv_out,
            json=json_out,
            plot=plot_out,
            board_bytes=size_option(board_memory, "--board-memory", at_least=BOARD_FLOOR),
            max_fraction=max_peak_fraction,
            min_decode_tps=min_decode_tps,
            force=force,
            timeout=timeout,
            drop_caches=drop_caches,
            metrics_textfile=metrics_textfile,
        ),
    )
    show_bench(result)
    if result.failures:
        raise typer.Exit(1)
