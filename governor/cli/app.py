"""The `governor` typer app: the global options, each command module's commands registered
explicitly in the order `--help` lists them, and the errors mapped to exit codes. No logic here:
commands parse, call governor.api and render (governor/cli/render.py).

Imports are lazy so that `governor launch` stays cheap to start (see perf/launch)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from governor import __version__, log
from governor.cli import bench, deploy, operate, run
from governor.cli import compile as compile_time
from governor.cli.choices import COMPLETE_VAR
from governor.cli.complete import answer
from governor.cli.options import STATE
from governor.errors import EXIT_USAGE, GovernorError, Interrupted, Reported, report

app = typer.Typer(
    name="governor",
    help="cgroup v2 resource governor and launcher for LLM inference engines on small boards.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


DISTRIBUTION = "cgroup-governor"  # the name pip knows (`governor` on PyPI is another project)


def version_line() -> str:
    """``governor 0.2.0``: the installed distribution's version, else (a source tree on the
    path, not installed) the package's own __version__."""
    from importlib import metadata  # ~70 ms of imports: only when asked

    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = __version__
    return f"governor {version}"


def _version(asked: bool) -> None:
    if asked:
        typer.echo(version_line())
        raise typer.Exit


@app.callback()
def _global(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks and debug logs")] = False,
    root: Annotated[
        Path,
        typer.Option(
            "--root", help="filesystem root to probe /proc and /sys under (offline checks)"
        ),
    ] = Path("/"),
    cgroup_root: Annotated[
        Path | None,
        typer.Option("--cgroup-root", help="cgroup2 mount to use instead of the probed one"),
    ] = None,
    sysfs_root: Annotated[
        Path | None,
        typer.Option(
            "--sysfs-root",
            help="sysfs tree whose cpufreq/devfreq clocks [clocks] sets (default: ROOT/sys)",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", help="print the version and exit", is_eager=True, callback=_version
        ),
    ] = False,
) -> None:

    STATE.debug = debug
    STATE.root = root
    STATE.cgroup_root = cgroup_root
    STATE.sysfs_root = sysfs_root
    log.configure(debug=debug)


_NO_INTERSPERSED = {"allow_interspersed_args": False}  # the engine's argv follows, untouched

# (command, app.command() settings), in the order `governor --help` lists them
COMMANDS: tuple[tuple[Callable[..., Any], dict[str, Any]], ...] = (
    (compile_time.check, {}),
    (compile_time.plan, {}),
    (run.launch, {"context_settings": _NO_INTERSPERSED}),
    (run.monitor, {}),
    (run.apply, {}),
    (run.remove, {}),
    (deploy.install, {}),
    (deploy.uninstall, {}),
    (compile_time.schema, {}),
    (compile_time.doctor, {}),
    (compile_time.estimate, {}),
    (bench.bench, {"context_settings": _NO_INTERSPERSED}),
    (operate.metrics, {}),
    (compile_time.init, {}),
    (operate.status, {}),
    (operate.board, {"context_settings": _NO_INTERSPERSED}),
    (operate.top, {}),
    (operate.diff, {}),
    (operate.tune, {"cls": operate.TuneCommand}),
    (operate.rollback, {}),
)
for _command, _settings in COMMANDS:
    app.command(**_settings)(_command)
app.add_typer(deploy.render_app)  # governor render k8s|quadlet POLICY -- ENGINE...


def _fail(err: GovernorError) -> NoReturn:
    sys.exit(report(err, debug=STATE.debug))


def main(argv: list[str] | None = None) -> None:

    if os.environ.get(COMPLETE_VAR):  # a shell asks for completions (share/*/governor scripts)
        sys.exit(answer(typer.main.get_command(app), os.environ[COMPLETE_VAR]))
    try:
        rv = app(args=argv, standalone_mode=False)
    except GovernorError as err:
        _fail(err)
    except Reported as err:  # a launch's compile child printed it already
        sys.exit(err.exit_code)
    except typer.Abort as err:
        cause = err.__cause__  # click turns a KeyboardInterrupt into Abort
        if isinstance(cause, Interrupted):
            sys.stderr.write(f"governor: interrupted by signal {cause.signum}: rolled back\n")
            sys.exit(cause.exit_code)
        sys.stderr.write("governor: aborted\n")
        sys.exit(130)
    except Exception as err:
        # click's exceptions (typer vendors click, so match on the interface, not the class)
        fmt, code = getattr(err, "format_message", None), getattr(err, "exit_code", None)
        if not callable(fmt) or not isinstance(code, int):
            raise
        message = str(fmt()).strip()
        if "\n" in message:  # no_args_is_help: the help text itself
            sys.stderr.write(message + "\n")
            sys.exit(EXIT_USAGE)
        ctx = getattr(err, "ctx", None)
        cmd = getattr(ctx, "command_path", None) or "governor"
        sys.stderr.write(f"governor: {message} (command line)\nhint: {cmd} --help\n")
        sys.exit(code)
    sys.exit(rv if isinstance(rv, int) else 0)
