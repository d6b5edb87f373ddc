"""Compile-time commands: `check`, `plan`, `schema`, `doctor`, `estimate` and `init` (a
commented policy for a GGUF model on this board, governor/init/draft.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import click
import typer

from governor.cli.complete import complete_policy_file
from governor.cli.options import (
    BOARD_FLOOR,
    STATE,
    AllowMissing,
    Force,
    PolicyArg,
    exclusive,
    host_options,
    size_option,
    split_argv,
)
from governor.cli.render import show_check, show_doctor, show_estimate, show_plan
from governor.errors import UsageError


def check(
    policy: PolicyArg,
    allow_missing: AllowMissing = "",
    engine_argv: Annotated[
        str | None,
        typer.Option(
            "--engine-argv",
            help="the engine command line (one quoted string) to check as launch would:"
            " engine.max_context_tokens, the model files, the GGUF memory estimate",
        ),
    ] = None,
    force: Force = False,
) -> None:
    """Validate a policy and compile it against this host (exit 0 when it can be enforced);
    or check the board file (/etc/governor/board.toml: [[cgroup]] tables, no name)."""
    from governor.api import check as api_check

    board = api_check.check_board(policy, host_options(allow_missing).root)
    if board is not None:
        typer.echo(f"{policy}: ok (board file, {board} ungoverned cgroup(s))")
        return
    if engine_argv is not None:
        from governor.api import compile as api_compile

        plan, est, warnings = api_compile.check_engine(
            policy, host_options(allow_missing), split_argv(engine_argv), force=force
        )
        show_check(policy, plan, est, warnings)
    else:
        plan, warnings = api_check.check_policy(policy, host_options(allow_missing))
        show_check(policy, plan, warnings=warnings)


def plan(
    policy: PolicyArg,
    as_json: Annotated[bool, typer.Option("--json", help="print the Plan as JSON")] = False,
    allow_missing: AllowMissing = "",
) -> None:
    """Show what the policy means on this host: every cgroup write, in order, with its reason."""
    from governor.api import host as api_host

    show_plan(api_host.check(policy, host_options(allow_missing)), as_json=as_json)


def schema() -> None:
    """Print the JSON Schema of the policy language."""
    from governor.api import compile as api_compile

    typer.echo(json.dumps(api_compile.schema(), indent=2, sort_keys=True))


def doctor(
    as_json: Annotated[
        bool, typer.Option("--json", help="print facts and findings as JSON")
    ] = False,
) -> None:
    """What this host supports, what is missing, and how to fix each (exit 69 on errors)."""
    from governor.api import doctor as api_doctor

    host, findings = api_doctor.doctor(host_options())
    show_doctor(host, findings, as_json=as_json)
    if any(f.level == "error" for f in findings):
        raise typer.Exit(69)


def estimate(  # noqa: PLR0917  # typer passes every option as a parameter
    model: Annotated[
        Path | None,
        typer.Argument(
            help="GGUF model file; a models directory or a preset .ini: llama-server's router,"
            " a row per model; left out: the model(s) --engine-argv names (-m, or a router's"
            " --models-dir / --models-preset)",
            show_default=False,
        ),
    ] = None,
    ctx: Annotated[
        int | None, typer.Option("-c", "--ctx-size", help="context (-c)", min=0, max=1 << 24)
    ] = None,
    engine_argv: Annotated[
        str,
        typer.Option(
            "--engine-argv", help="llama.cpp options to honour, one string: '-nr -ub 128 -ctk q8_0'"
        ),
    ] = "",
    policy: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            "-p",
            help="budget = this policy's memory.max",
            autocompletion=complete_policy_file,
        ),
    ] = None,
    budget: Annotated[
        str | None, typer.Option("--budget", help="budget as a size (e.g. 1900M) instead")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the estimate as JSON")] = False,
) -> None:
    """Estimate llama.cpp's resident memory for a GGUF model (header only; no weights loaded);
    for llama-server's router (a models directory or preset) each model's and how many fit
    together, largest first. Exit 0 when it fits the budget (or none was given), 1 when it does
    not; --policy and
    --budget are mutually exclusive (2)."""
    from governor.api import compile as api_compile

    exclusive("--policy", policy is not None, "--budget", budget is not None, "give one budget")
    est = api_compile.estimate(
        model,
        host_options(),
        api_compile.EstimateOptions(
            ctx=ctx,
            engine_argv=split_argv(engine_argv),
            policy=policy,
            budget=size_option(budget, "--budget"),
        ),
    )
    show_estimate(est, as_json=as_json)
    if not est.fits:
        raise typer.Exit(1)


def init(  # noqa: PLR0917  # typer passes every option as a parameter
    model: Annotated[
        Path,
        typer.Option(
            "--model",
            "-m",
            help="the GGUF model file; a models directory or a preset .ini: llama-server's"
            " router; a .rkllm file: RKLLM's NPU memory",
            show_default=False,
        ),
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
    qos_class: Annotated[
        str | None,
        typer.Option(
            "--class",
            click_type=click.Choice(("interactive", "standard", "background")),
            help="the [qos] class to draft (default: interactive for llama-server, else"
            " standard); with the board's swap it chooses swap_max (docs/swap.md)",
        ),
    ] = None,
) -> None:
    """Write a commented policy for a GGUF model on this board (--root: another board's facts):
    memory.min/high/max from the estimate, the largest context that fits, big cores, prefetch,
    graded pressure rules. Exit 65 when the model does not fit even a small context; 75 when an
    RKLLM model's NPU memory does not fit beside the running RKLLM instances."""
    from governor.api import compile as api_compile
    from governor.api.outputs import write_policy
    from governor.init import rkllm, router
    from governor.init.draft import Request

    board = size_option(board_memory, "--board-memory", at_least=BOARD_FLOOR)
    if board is not None and board <= 0:
        raise UsageError("--board-memory must be above 0 (--board-memory)", hint="e.g. 2G")
    draft = api_compile.init(
        host_options(),
        Request(
            model=model,
            ctx=ctx,
            board_memory=board,
            engine_argv=tuple(shlex.split(engine_argv)),
            name=name,
            output=output,
            qos_class=qos_class,
        ),
    )
    for line in draft.text.splitlines():  # what the policy's comments warn about, said once
        if line.startswith("# WARNING: "):
            typer.echo(f"governor: warning: {line.removeprefix('# WARNING: ')}", err=True)
    if output is None:
        typer.echo(draft.text, nl=False)
        return
    write_policy(output, draft.text, force=force)
    s = draft.sizing
    root = f"--root {STATE.root} " if STATE.root != Path("/") else ""
    allow = f" --allow-missing {','.join(draft.missing)}" if draft.missing else ""
    if isinstance(s, rkllm.RkllmSizing):  # an RKLLM model (governor/init/rkllm.py)
        typer.echo(
            f"wrote {output}: MAX_CONTEXT_LEN {s.ctx}, device memory {s.npu >> 20} MiB"
            f" ({s.source}; board {s.board >> 20} MiB)\n"
            f"next: governor {root}check {output}{allow} --engine-argv"
            f" {shlex.quote(shlex.join(draft.engine))}"
        )
        return
    if isinstance(s, router.RouterSizing):  # llama-server's router (governor/init/router.py)
        typer.echo(
            f"wrote {output}: --models-max {s.models_max}, memory.high {s.mem_high >> 20} MiB,"
            f" max {s.mem_max >> 20} MiB (the {s.models_max} largest models"
            f" {s.chosen >> 20} MiB, board {s.board >> 20} MiB)\n"
            f"next: governor {root}check {output}{allow} --engine-argv"
            f" {shlex.quote(shlex.join(draft.engine))}"
        )
        return
    typer.echo(
        f"wrote {output}: -c {s.ctx}, memory.min {s.mem_min >> 20} MiB, high"
        f" {s.mem_high >> 20} MiB, max {s.mem_max >> 20} MiB (estimate {s.est.total >> 20} MiB,"
        f" board {s.board >> 20} MiB)\n"
        f"next: governor {root}check {output}{allow} --engine-argv"
        f" {shlex.quote(shlex.join(draft.engine))}"
    )
