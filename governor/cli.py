"""Command line: parse, call governor.api, render, map errors to exit codes. No logic here.

Imports are lazy so that `governor launch` stays cheap to start (see bench/launch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from governor.errors import EXIT_USAGE, GovernorError

if TYPE_CHECKING:
    from governor.api import HostOptions

app = typer.Typer(
    name="governor",
    help="cgroup v2 resource governor and launcher for LLM inference engines on small boards.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


class _State:
    debug = False
    root = Path("/")
    cgroup_root: Path | None = None


STATE = _State()

PolicyArg = Annotated[Path, typer.Argument(help="policy TOML file", show_default=False)]
AllowMissing = Annotated[
    str,
    typer.Option(
        "--allow-missing",
        help="comma list of controllers (memory,cpu,cpuset,io,pids) or 'psi' to run without;"
        " the limits they carry are reported as NOT in force",
    ),
]


def _opts(allow_missing: str = "") -> HostOptions:
    from governor.api import HostOptions

    allowed = frozenset(a.strip() for a in allow_missing.split(",") if a.strip())
    unknown = allowed - {"memory", "cpu", "cpuset", "io", "pids", "psi"}
    if unknown:
        from governor.errors import UsageError

        raise UsageError(
            f"unknown name in --allow-missing: {','.join(sorted(unknown))} (command line)",
            hint="use memory, cpu, cpuset, io, pids or psi",
        )
    return HostOptions(root=STATE.root, cgroup_root=STATE.cgroup_root, allow_missing=allowed)


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
) -> None:
    from governor import log

    STATE.debug = debug
    STATE.root = root
    STATE.cgroup_root = cgroup_root
    log.configure(debug=debug)


@app.command()
def check(policy: PolicyArg, allow_missing: AllowMissing = "") -> None:
    """Validate a policy and compile it against this host (exit 0 when it can be enforced)."""
    from governor import api

    plan = api.check(policy, _opts(allow_missing))
    degraded = f", {len(plan.degraded)} limit(s) NOT in force" if plan.degraded else ""
    typer.echo(f"{policy}: ok ({len(plan.writes)} cgroup writes{degraded})")
    for d in plan.degraded:
        typer.echo(f"  NOT in force: {d}")


@app.command()
def plan(
    policy: PolicyArg,
    as_json: Annotated[bool, typer.Option("--json", help="print the Plan as JSON")] = False,
    allow_missing: AllowMissing = "",
) -> None:
    """Show what the policy means on this host: every cgroup write, in order, with its reason."""
    from governor import api

    compiled = api.check(policy, _opts(allow_missing))
    if as_json:
        typer.echo(compiled.model_dump_json(indent=2))
    else:
        from governor.plan.render import plan_table

        typer.echo(plan_table(compiled), nl=False)


@app.command(context_settings={"allow_interspersed_args": False})
def launch(
    policy: Annotated[Path, typer.Option("--policy", "-p", help="policy TOML file")],
    engine: Annotated[
        list[str],
        typer.Argument(help="the engine command after --, passed through byte for byte"),
    ],
    report: Annotated[
        Path | None, typer.Option("--report", help="write a JSON summary of the run here")
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="leave the slice (and any stragglers) after exit")
    ] = False,
    allow_missing: AllowMissing = "",
) -> None:
    """Run an engine inside the policy's cgroup; exit with its status (128+N on signal N)."""
    from governor import api

    code = api.launch(
        policy,
        tuple(engine),
        _opts(allow_missing),
        api.LaunchOptions(report=report, keep=keep),
    )
    raise typer.Exit(code)


@app.command()
def apply(policy: PolicyArg, allow_missing: AllowMissing = "") -> None:
    """Create the policy's slice with its limits, without starting anything."""
    from governor import api

    plan = api.apply(policy, _opts(allow_missing))
    typer.echo(
        f"applied {plan.policy}: {plan.cgroup_root}/{plan.group} ({len(plan.writes)} writes)"
    )


@app.command()
def remove(policy: PolicyArg) -> None:
    """Kill whatever runs in the policy's cgroup and remove it."""
    from governor import api

    removed = api.remove(policy, _opts())
    what = ", ".join(removed.removed) or "nothing (already gone)"
    typer.echo(f"removed {what}" + (" (killed its processes)" if removed.killed else ""))


@app.command()
def schema() -> None:
    """Print the JSON Schema of the policy language."""
    from governor import api

    typer.echo(json.dumps(api.schema(), indent=2, sort_keys=True))


@app.command()
def doctor(
    as_json: Annotated[
        bool, typer.Option("--json", help="print facts and findings as JSON")
    ] = False,
) -> None:
    """What this host supports, what is missing, and how to fix each (exit 69 on errors)."""
    from governor import api

    host, findings = api.doctor(_opts())
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "host": host.model_dump(mode="json"),
                    "findings": [_finding_dict(f) for f in findings],
                },
                indent=2,
            )
        )
    else:
        for f in findings:
            typer.echo(f"{f.level.upper():5} {f.topic:<16} {f.message}")
            if f.fix and f.level != "ok":
                typer.echo(f"{'':5} {'':<16} fix: {f.fix}")
    if any(f.level == "error" for f in findings):
        raise typer.Exit(69)


def _finding_dict(f: object) -> dict[str, object]:
    return {k: getattr(f, k) for k in ("level", "topic", "message", "fix")}


def _fail(err: GovernorError) -> NoReturn:
    sys.stderr.write(f"governor: {err}\n")
    if err.hint:
        sys.stderr.write(f"hint: {err.hint}\n")
    if STATE.debug:
        import traceback

        traceback.print_exception(err)
    sys.exit(err.exit_code)


def main(argv: list[str] | None = None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
    except GovernorError as err:
        _fail(err)
    except typer.Abort:
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
