"""Command line: parse, call governor.api, render (governor/cli/render.py), map errors to exit
codes. No logic here.

Imports are lazy so that `governor launch` stays cheap to start (see perf/launch)."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from governor.cli.options import split_argv
from governor.errors import EXIT_USAGE, GovernorError, Interrupted, one_line

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


def _finite(value: float | None) -> float | None:
    """typer's ranges compare, and every comparison with NaN is False: refuse it here."""
    if value is not None and value != value:  # noqa: PLR0124  # NaN is the one value != itself
        raise typer.BadParameter("nan is not a number of seconds")
    return value


SampleInterval = Annotated[
    float,
    typer.Option(
        "--sample-interval",
        callback=_finite,
        help="seconds between samples of memory.current/peak/stat (0.05-3600)",
        min=0.05,
        max=3600.0,
    ),
]


class _Psi(enum.StrEnum):
    trigger = "trigger"
    poll = "poll"


Psi = Annotated[
    _Psi,
    typer.Option(
        "--psi",
        help="trigger: PSI trigger fds (the kernel wakes the monitor); poll: read total= at"
        " every sample instead (kernels or delegations that refuse triggers, comparisons)",
    ),
]


def _listen(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    from governor.errors import UsageError
    from governor.metrics.listen import parse_listen

    try:
        return parse_listen(text)
    except ValueError as err:
        raise UsageError(
            f"bad --metrics value: {err} (command line)",
            hint="--metrics 9101 (loopback), --metrics 0.0.0.0:9101, --metrics [::1]:9101",
        ) from None


Metrics = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        envvar="GOVERNOR_METRICS",
        show_envvar=True,
        help="serve Prometheus /metrics on [ADDR:]PORT while it runs (ADDR defaults to"
        ' 127.0.0.1; see README "Metrics")',
    ),
]


Force = Annotated[
    bool,
    typer.Option("--force", help="go ahead even when the GGUF memory estimate exceeds memory.max"),
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
    """Validate a policy and compile it against this host (exit 0 when it can be enforced)."""
    from governor import api
    from governor.cli.render import show_check

    if engine_argv is not None:
        plan, est, warnings = api.check_engine(
            policy, _opts(allow_missing), split_argv(engine_argv), force=force
        )
        show_check(policy, plan, est, warnings)
    else:
        show_check(policy, api.check(policy, _opts(allow_missing)))


@app.command()
def plan(
    policy: PolicyArg,
    as_json: Annotated[bool, typer.Option("--json", help="print the Plan as JSON")] = False,
    allow_missing: AllowMissing = "",
) -> None:
    """Show what the policy means on this host: every cgroup write, in order, with its reason."""
    from governor import api
    from governor.cli.render import show_plan

    show_plan(api.check(policy, _opts(allow_missing)), as_json=as_json)


class _Backend(enum.StrEnum):
    cgroupfs = "cgroupfs"
    systemd = "systemd"
    auto = "auto"


@app.command(context_settings={"allow_interspersed_args": False})
def launch(  # noqa: PLR0917  # typer passes every option as a parameter
    policy: Annotated[Path, typer.Option("--policy", "-p", help="policy TOML file")],
    engine: Annotated[
        list[str],
        typer.Argument(help="the engine command after --, passed through byte for byte"),
    ],
    report: Annotated[
        Path | None, typer.Option("--report", help="write a JSON summary of the run here")
    ] = None,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="leave the slice (and any stragglers) after exit; status shows it and"
            " `governor remove` takes it away",
        ),
    ] = False,
    allow_missing: AllowMissing = "",
    sample_interval: SampleInterval = 1.0,
    backend: Annotated[
        _Backend,
        typer.Option(
            "--backend",
            help="cgroupfs: write <slice>/<name> directly; systemd: run in a delegated unit"
            " (the installed governor@ service, else a transient scope over D-Bus); auto:"
            " systemd when it is PID 1 and answers on the bus",
        ),
    ] = _Backend.cgroupfs,
    force: Force = False,
    psi: Psi = _Psi.trigger,
    metrics: Metrics = None,
) -> None:
    """Run an engine inside the policy's cgroup; exit with its status (128+N on signal N)."""
    from governor import api

    code = api.launch(
        policy,
        tuple(engine),
        _opts(allow_missing),
        api.LaunchOptions(
            report=report,
            keep=keep,
            sample_s=sample_interval,
            backend=backend.value,
            force=force,
            psi_triggers=psi is _Psi.trigger,
            metrics=_listen(metrics),
        ),
    )
    raise typer.Exit(code)


@app.command()
def monitor(  # noqa: PLR0917  # typer passes every option as a parameter
    policy: PolicyArg,
    report: Annotated[
        Path | None, typer.Option("--report", help="write the monitor's JSON report here")
    ] = None,
    cgroup: Annotated[
        str | None,
        typer.Option(
            "--cgroup",
            help="watch this cgroup (relative to the cgroup2 root, e.g. a systemd unit's)"
            " instead of <slice>/<name>",
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option("--duration", help="stop after this many seconds", min=0.1, callback=_finite),
    ] = None,
    allow_missing: AllowMissing = "",
    sample_interval: SampleInterval = 1.0,
    psi: Psi = _Psi.trigger,
    metrics: Metrics = None,
) -> None:
    """Act on [[pressure]] rules for an already-running slice until SIGINT/SIGTERM or it is gone.

    Publishes its state under /run/governor/NAME like launch (status, tune and metrics see it);
    exit 69 when NAME already has a live supervisor."""
    from governor import api

    out = api.monitor(
        policy,
        _opts(allow_missing),
        api.MonitorOptions(
            sample_s=sample_interval,
            report=report,
            cgroup=cgroup,
            duration_s=duration,
            psi_triggers=psi is _Psi.trigger,
            metrics=_listen(metrics),
        ),
    )
    fired = sum(r["fired"] for r in out["rules"])
    typer.echo(f"{policy}: {fired} rule firing(s), {out['oom_kill_seen']} oom_kill seen")


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


InstallRoot = Annotated[
    Path,
    typer.Option(
        "--root",
        help="write under this directory instead of / (a DESTDIR; the global --root, before"
        " the command, is where /proc and /sys are probed)",
    ),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="show the diff, write nothing")]


@app.command()
def install(
    policy: PolicyArg,
    engine: Annotated[
        list[str] | None,
        typer.Argument(help="optional engine command after --, for the unit's ExecStart="),
    ] = None,
    root: InstallRoot = Path("/"),
    dry_run: DryRun = False,
    allow_missing: AllowMissing = "",
) -> None:
    """Write the policy's systemd slice and governor@ service drop-in (diff shown first)."""
    from governor import api
    from governor.cli.render import show_install

    result = api.install(
        policy,
        _opts(allow_missing),
        api.InstallOptions(root=root, dry_run=dry_run, engine=tuple(engine or ())),
    )
    show_install(result, "installed" if not dry_run else "would install", dry_run)


@app.command()
def uninstall(
    policy: Annotated[str, typer.Argument(help="policy TOML file or policy name")],
    root: InstallRoot = Path("/"),
    dry_run: DryRun = False,
) -> None:
    """Remove exactly what `governor install` wrote for the policy; restore what it replaced."""
    from governor import api
    from governor.cli.render import show_install

    result = api.uninstall(policy, root, dry_run=dry_run)
    show_install(result, "uninstalled" if not dry_run else "would uninstall", dry_run)


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
    from governor.cli.render import show_doctor

    host, findings = api.doctor(_opts())
    show_doctor(host, findings, as_json=as_json)
    if any(f.level == "error" for f in findings):
        raise typer.Exit(69)


@app.command()
def estimate(  # noqa: PLR0917  # typer passes every option as a parameter
    model: Annotated[Path, typer.Argument(help="GGUF model file", show_default=False)],
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
        Path | None, typer.Option("--policy", "-p", help="budget = this policy's memory.max")
    ] = None,
    budget: Annotated[
        str | None, typer.Option("--budget", help="budget as a size (e.g. 1900M) instead")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the estimate as JSON")] = False,
) -> None:
    """Estimate llama.cpp's resident memory for a GGUF model (header only; no weights loaded)."""
    from governor import api
    from governor.cli.render import show_estimate

    est = api.estimate(
        model,
        _opts(),
        api.EstimateOptions(
            ctx=ctx,
            engine_argv=split_argv(engine_argv),
            policy=policy,
            budget=_size(budget),
        ),
    )
    show_estimate(est, as_json=as_json)
    if not est.fits:
        raise typer.Exit(1)


def _size(text: str | None) -> int | None:
    if text is None:
        return None
    from governor.errors import UsageError
    from governor.policy.values import parse_size

    try:
        return parse_size(text).bytes
    except ValueError as err:
        raise UsageError(f"not a size: {text!r} ({err}) (command line)", hint="e.g. 1900M") from err


def _fail(err: GovernorError) -> NoReturn:
    sys.stderr.write(f"governor: {err}\n")
    if err.hint:
        sys.stderr.write(f"hint: {one_line(err.hint)}\n")
    if STATE.debug:
        import traceback

        traceback.print_exception(err)
    sys.exit(err.exit_code)


def main(argv: list[str] | None = None) -> None:
    import governor.cli.bench  # registers `bench` and `metrics` on app
    import governor.cli.compile  # registers `init` on app
    import governor.cli.operate  # noqa: F401  # registers the operator commands on app

    try:
        rv = app(args=argv, standalone_mode=False)
    except GovernorError as err:
        _fail(err)
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
