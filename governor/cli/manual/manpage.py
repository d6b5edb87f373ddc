"""governor(1) from the click command tree the typer app builds: every command in the order
`governor --help` lists them, its usage line, its help text, its arguments and options (with
their help, choices and defaults as click prints them). Nothing here is typed twice: a new
option shows up in the page when the page is regenerated, and a test fails until it is."""

from __future__ import annotations

import inspect

import click
from typer.utils import get_params_from_function

from governor.board.file import BOARD_ENV, BOARD_FILE
from governor.cli.choices import METRICS_ENV
from governor.cli.manual.roff import NO_HYPHENATION, bold, escape
from governor.errors import (
    EXIT_NOINPUT,
    EXIT_NOPERM,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_OSERR,
    EXIT_POLICY,
    EXIT_TEMPFAIL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)

# design.md "Errors and exit codes": the codes are the constants the program exits with
EXIT_STATUS: tuple[tuple[str, str], ...] = (
    ("0", "success; diff: in sync; estimate: the model fits the budget"),
    ("1", "estimate: the model does not fit; diff: drift; bench: a run failed its gate"),
    (str(EXIT_USAGE), "usage error (bad options, mutually exclusive options)"),
    (str(EXIT_POLICY), "the policy (or the engine's argv) is invalid"),
    (str(EXIT_NOINPUT), "a file is missing (policy, model, prefetch file) or NAME is not governed"),
    (
        str(EXIT_UNAVAILABLE),
        "the host cannot enforce the policy (no cgroup2, a controller missing, already"
        " running), or a server was not ready within engine.ready_timeout or stopped giving"
        " tokens to engine.probe_generate",
    ),
    (str(EXIT_OSERR), "a kernel write failed (the message names cgroup, file, value and errno)"),
    (
        str(EXIT_TEMPFAIL),
        "the board cannot admit the engine now: its guarantees (or, under [qos] admit ="
        ' "refuse", its peak) do not fit beside the other slices\' claims; nothing applied',
    ),
    (str(EXIT_NOPERM), "permission denied"),
    (f"{EXIT_NOT_EXECUTABLE} / {EXIT_NOT_FOUND}", "the engine is not executable / not found"),
    ("other", "launch: the engine's own status; 128+N when it died of signal N"),
)

ENVIRONMENT: tuple[tuple[str, str], ...] = (
    ("GOVERNOR_RUN_DIR", "where running policies publish their state (default /run/governor"
     " as root, else $XDG_RUNTIME_DIR/governor)"),
    ("GOVERNOR_STATE_DIR", "where what runs measured of each model is kept across reboots"
     " (default /var/lib/governor as root, else $XDG_STATE_HOME/governor)"),
    (METRICS_ENV, "the default of --metrics"),
    (BOARD_ENV, f"the board file (default {BOARD_FILE})"),
)  # fmt: skip


def _text(help_text: str | None) -> list[str]:
    """A docstring as roff paragraphs: lines joined, blank lines separate paragraphs."""
    if not help_text:
        return []
    paras = [" ".join(p.split()) for p in inspect.cleandoc(help_text).split("\n\n")]
    out: list[str] = []
    for i, para in enumerate(p for p in paras if p):
        if i:
            out.append(".IP")
        out.append(escape(para))
    return out


def _argument_help(cmd: click.Command) -> dict[str, str]:
    """The help typer was given for each argument. typer-slim 0.21 sets it on its click
    Argument before click 8.5's Parameter.__init__ resets it to None (so `--help` lists the
    arguments bare): read it from the function's typer.Argument(...) instead."""

    function = getattr(cmd.callback, "__wrapped__", None)
    if function is None:
        return {}
    out: dict[str, str] = {}
    for name, meta in get_params_from_function(function).items():
        text = getattr(meta.default, "help", None)
        if isinstance(text, str):
            out[name] = text
    return out


def _params(cmd: click.Command, ctx: click.Context) -> list[str]:
    out: list[str] = []
    argument_help = _argument_help(cmd)
    for param in cmd.get_params(ctx):
        if isinstance(param, click.Option):
            if param.hidden or "--help" in param.opts:
                continue
            record = param.get_help_record(ctx)
            if record is None:
                continue
            names, help_text = record
            out += [".TP", bold(names), escape(help_text)]
        elif isinstance(param, click.Argument):
            metavar = param.make_metavar(ctx)
            help_text = argument_help.get(param.name or "", "")
            out += [".TP", f"\\fI{escape(metavar)}\\fR", escape(help_text)]
    return out


def _usage(cmd: click.Command, ctx: click.Context) -> str:
    pieces = " ".join(cmd.collect_usage_pieces(ctx))
    return f"{bold(ctx.command_path)} {escape(pieces)}".rstrip()


def _commands(group: click.Group, ctx: click.Context) -> list[str]:
    out: list[str] = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        sub = click.Context(cmd, info_name=name, parent=ctx)
        if isinstance(cmd, click.Group):
            out += [f'.SS "{escape(sub.command_path)}"', *_text(cmd.help)]
            out += _commands(cmd, sub)
            continue
        out += [f'.SS "{escape(sub.command_path)}"', _usage(cmd, sub), ".PP", *_text(cmd.help)]
        out += _params(cmd, sub)
    return out


def roff(app: click.Group, version: str) -> str:
    ctx = click.Context(app, info_name="governor")
    out = [
        '.\\" generated by `python -m governor.cli.manual` from the command line (governor/cli):'
        " do not edit",
        f'.TH GOVERNOR 1 "" "governor {escape(version)}" "User Commands"',
        *NO_HYPHENATION,
        ".SH NAME",
        "governor \\- " + escape(inspect.cleandoc(app.help or "").split("\n")[0].rstrip(".")),
        ".SH SYNOPSIS",
        f"{bold('governor')} [\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
        escape(
            "governor runs an LLM engine (llama.cpp, llama-server, RKLLM, any command) inside"
            " a cgroup v2 slice with the limits its policy file sets (see governor.toml(5)),"
            " acts on memory pressure while it runs, and lets an operator see and change a"
            " live board. Errors are one line, governor: WHAT (WHERE), and a hint."
        ),
        ".SH GLOBAL OPTIONS",
        *_params(app, ctx),
        ".SH COMMANDS",
        *_commands(app, ctx),
        ".SH EXIT STATUS",
    ]
    for code, meaning in EXIT_STATUS:
        out += [".TP", bold(code), escape(meaning)]
    out.append(".SH ENVIRONMENT")
    for name, meaning in ENVIRONMENT:
        out += [".TP", bold(name), escape(meaning)]
    out += [
        ".SH FILES",
        ".TP",
        bold("/etc/governor/NAME.toml"),
        escape("an installed policy (governor install); its engine command in NAME.env"),
        ".TP",
        bold("/etc/governor/board.toml"),
        escape("the board file: the board's ungoverned cgroups and their QoS class"),
        ".SH SEE ALSO",
        "\\fBgovernor.toml\\fR(5), \\fBsystemd.resource\\-control\\fR(5), \\fBcgroups\\fR(7),"
        " \\fBsystemd\\-oomd\\fR(8)",
    ]
    return "\n".join(out) + "\n"
