"""`governor init` (registered on governor.cli.app.app): a commented policy for a GGUF model on
this board, sized from the GGUF estimate and the probed host (governor/engines/draft.py)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from governor.cli.app import STATE, _opts, _size, app


@app.command()
def init(  # noqa: PLR0917  # typer passes every option as a parameter
    model: Annotated[
        Path, typer.Option("--model", "-m", help="the GGUF model file", show_default=False)
    ],
    ctx: Annotated[
        int | None,
        typer.Option(
            "--ctx", "-c", help="context (-c) to size for (default: the largest that fits)", min=1
        ),
    ] = None,
    board_memory: Annotated[
        str | None,
        typer.Option("--board-memory", help="the board's RAM, e.g. 2G (default: MemTotal)"),
    ] = None,
    engine_argv: Annotated[
        str,
        typer.Option(
            "--engine-argv",
            help="the engine command line or its llama.cpp options, one string"
            " ('llama-completion -nr -t 4' or '-nr -ub 128'); -m and -c come from --model/--ctx",
        ),
    ] = "",
    name: Annotated[
        str | None, typer.Option("--name", help="policy name (default: from the model file)")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="write here instead of stdout")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing -o file")] = False,
) -> None:
    """Write a commented policy for a GGUF model on this board (--root: another board's facts):
    memory.min/high/max from the estimate, the largest context that fits, big cores, prefetch,
    graded pressure rules. Exit 65 when the model does not fit even a small context."""
    from governor import api
    from governor.engines.draft import Request, write_policy

    board = _size(board_memory)
    if board is not None and board <= 0:
        from governor.errors import UsageError

        raise UsageError("--board-memory must be above 0 (command line)", hint="e.g. 2G")
    draft = api.init(
        _opts(),
        Request(
            model=model,
            ctx=ctx,
            board_memory=board,
            engine_argv=tuple(shlex.split(engine_argv)),
            name=name,
            output=output,
        ),
    )
    if output is None:
        typer.echo(draft.text, nl=False)
        return
    write_policy(output, draft.text, force=force)
    s = draft.sizing
    root = f"--root {STATE.root} " if STATE.root != Path("/") else ""
    allow = f" --allow-missing {','.join(draft.missing)}" if draft.missing else ""
    typer.echo(
        f"wrote {output}: -c {s.ctx}, memory.min {s.mem_min >> 20} MiB, high"
        f" {s.mem_high >> 20} MiB, max {s.mem_max >> 20} MiB (estimate {s.est.total >> 20} MiB,"
        f" board {s.board >> 20} MiB)\n"
        f"next: governor {root}check {output}{allow} --engine-argv"
        f" {shlex.quote(shlex.join(draft.engine))}"
    )
