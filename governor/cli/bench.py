"""`governor bench` and `governor metrics` (registered on governor.cli.app.app): what the engine
costs under a policy, and the Prometheus exposition of the governed slices."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from governor.cli.app import AllowMissing, Force, _opts, _size, app


@app.command(context_settings={"allow_interspersed_args": False})
def bench(  # noqa: PLR0917  # typer passes every option as a parameter
    policy: Annotated[Path, typer.Option("--policy", "-p", help="policy TOML file")],
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
    from governor import api
    from governor.bench.main import BenchOptions
    from governor.cli.render import show_bench

    result = api.bench(
        policy,
        tuple(engine),
        _opts(allow_missing),
        BenchOptions(
            runs=runs,
            interval=interval,
            models=tuple(model or ()),
            ctxs=tuple(ctx or ()),
            csv=csv_out,
            json=json_out,
            plot=plot_out,
            board_bytes=_size(board_memory),
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


@app.command()
def metrics(
    name: Annotated[
        str | None, typer.Argument(help="policy name (default: every governed slice)")
    ] = None,
    textfile: Annotated[
        Path | None,
        typer.Option(
            "--textfile",
            help="write DIR/governor.prom atomically for node_exporter's textfile collector"
            " (--collector.textfile.directory DIR) instead of printing",
        ),
    ] = None,
) -> None:
    """The governed slices' Prometheus metrics (the names `launch --metrics` serves), once:
    printed, or written for node_exporter (run it from a timer). Exit 66 when NAME is not
    governed here or DIR does not exist."""
    from governor import api

    out = api.metrics(textfile, name)
    if isinstance(out, bytes):
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    else:
        typer.echo(f"wrote {out}")
