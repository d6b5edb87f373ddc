"""The `governor` command: run-time commands on a lean path, everything else through typer.

`governor launch` is on the engine's critical path (a llama-server restart, a systemd start),
so it does not pay for the compile-time stack: this module parses the launch command line with
the standard library, forks the watchdog while the interpreter is still nearly empty
(governor/supervise/watchdog.py), and calls governor.api.launch, which finds the compiled plan in
the cache (governor/cache/plans.py) and hands it to the supervisor. A cache miss compiles in a
short-lived child (governor/api/isolate.py): this process never imports pydantic or the
compiler, hit or miss. Anything this parser does not recognise (``--help``, a typo, another
command) goes to the typer CLI (governor/cli/app.py), which owns the help texts and the usage
errors, so both paths accept the same command line.

`governor status` (``[--debug] [--root R] status [NAME] [--json] [--prune]``) takes a lean path
too (issue 47 item 3): the same function as typer's command (governor/cli/statuscmd.py) without
typer and click, whose import is ~2 s of each `status` in the emulated test guests.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from governor.cli.choices import BACKENDS, COMPLETE_VAR, METRICS_ENV, PSI_MODES

_GLOBAL_VALUE = ("--root", "--cgroup-root", "--sysfs-root")
_LAUNCH_VALUE = {
    "--policy": "policy",
    "-p": "policy",
    "--report": "report",
    "--allow-missing": "allow_missing",
    "--sample-interval": "sample_interval",
    "--backend": "backend",
    "--psi": "psi",
    "--metrics": "metrics",
}
_LAUNCH_FLAGS = {"--keep": "keep", "--force": "force"}
_CHOICES = {"backend": BACKENDS, "psi": PSI_MODES}


class _Fallback(Exception):
    """Not a command line this parser handles: typer will."""


def _split_value(args: list[str], i: int) -> tuple[str, str, int]:
    """(option, value, next index) for ``--opt value`` and ``--opt=value``."""
    arg = args[i]
    if "=" in arg and arg.startswith("--"):
        opt, _, value = arg.partition("=")
        return opt, value, i + 1
    if i + 1 >= len(args):
        raise _Fallback
    return arg, args[i + 1], i + 2


def parse_launch(args: list[str]) -> dict[str, Any]:
    """The launch command line (global options first) as a dict; _Fallback when unsure."""
    out: dict[str, Any] = {
        "debug": False,
        "root": "/",
        "cgroup_root": None,
        "sysfs_root": None,
        "report": None,
        "keep": False,
        "force": False,
        "allow_missing": "",
        "sample_interval": "1.0",
        "backend": "cgroupfs",
        "psi": "trigger",
        "policy": None,
        "metrics": os.environ.get(METRICS_ENV) or None,
    }
    i = 0
    while i < len(args) and args[i] != "launch":
        arg = args[i]
        if arg == "--debug":
            out["debug"], i = True, i + 1
            continue
        opt, value, i = _split_value(args, i)
        if opt not in _GLOBAL_VALUE:
            raise _Fallback
        out[opt[2:].replace("-", "_")] = value
    if i >= len(args):
        raise _Fallback
    i += 1
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break  # the engine's argv starts here (no interspersed options, like typer's)
        if arg in _LAUNCH_FLAGS:
            out[_LAUNCH_FLAGS[arg]], i = True, i + 1
            continue
        opt, value, i = _split_value(args, i)
        if opt not in _LAUNCH_VALUE:
            raise _Fallback
        out[_LAUNCH_VALUE[opt]] = value
    out["engine"] = tuple(args[i:])
    for key, allowed in _CHOICES.items():
        if out[key] not in allowed:
            raise _Fallback
    try:
        out["sample_interval"] = float(out["sample_interval"])
    except ValueError:
        raise _Fallback from None
    if out["policy"] is None or not out["engine"] or not 0.05 <= out["sample_interval"] <= 3600:
        raise _Fallback
    missing = frozenset(a.strip() for a in out["allow_missing"].split(",") if a.strip())
    from governor.kernel.files import MISSABLE  # standard library only

    if missing - MISSABLE:
        raise _Fallback
    out["allow_missing"] = missing
    if out["metrics"] is not None:
        from governor.metrics.listen import parse_listen  # standard library only

        try:
            out["metrics"] = parse_listen(out["metrics"])
        except ValueError:
            raise _Fallback from None  # typer says what is wrong with it
    return out


def parse_status(args: list[str]) -> dict[str, Any]:
    """``[--debug] [--root R] status [NAME] [--json] [--prune]`` as a dict; _Fallback for
    anything else (``--help``, another global option, a typo: typer says what is wrong)."""
    out: dict[str, Any] = {
        "debug": False, "root": "/", "name": None, "as_json": False, "prune": False
    }  # fmt: skip
    i = 0
    while i < len(args) and args[i] != "status":
        if args[i] == "--debug":
            out["debug"], i = True, i + 1
            continue
        opt, value, i = _split_value(args, i)
        if opt != "--root" or not value:
            raise _Fallback
        out["root"] = value
    if i >= len(args):
        raise _Fallback
    for arg in args[i + 1 :]:
        if arg in ("--json", "--prune"):
            out["as_json" if arg == "--json" else "prune"] = True
        elif arg.startswith("-") or out["name"] is not None:
            raise _Fallback  # --help, --, an unknown option, a second name
        else:
            out["name"] = arg
    return out


def _status(parsed: dict[str, Any]) -> int:
    """`governor status` without typer and click (issue 47 item 3: every test guest's `status`
    paid for them); the same calls and output as governor/cli/operate.py status."""
    from governor.cli.statuscmd import status

    return status(**parsed)


def _lean(args: list[str]) -> tuple[Any, dict[str, Any]] | None:
    """The lean path's (runner, parsed command line), None for typer's."""
    if os.environ.get(COMPLETE_VAR):
        return None
    try:
        if "launch" in args:
            parsed = parse_launch(args)
            if {"-h", "--help"} & set(args[: len(args) - len(parsed["engine"])]):
                return None
            return _launch, parsed
        if "status" in args:
            return _status, parse_status(args)
    except _Fallback:
        return None
    return None


def _launch(parsed: dict[str, Any]) -> int:
    from governor.supervise.watchdog import fork_watchdog

    # before anything else is imported: the watchdog is a copy of a nearly empty interpreter
    watchdog = fork_watchdog()
    from pathlib import Path

    from governor import log
    from governor.api import host as api_host
    from governor.api import launch as api_launch

    log.configure(debug=parsed["debug"])
    try:
        return api_launch.launch(
            Path(parsed["policy"]),
            parsed["engine"],
            api_host.HostOptions(
                root=Path(parsed["root"]),
                cgroup_root=None if parsed["cgroup_root"] is None else Path(parsed["cgroup_root"]),
                sysfs_root=None if parsed["sysfs_root"] is None else Path(parsed["sysfs_root"]),
                allow_missing=parsed["allow_missing"],
            ),
            api_launch.LaunchOptions(
                report=None if parsed["report"] is None else Path(parsed["report"]),
                keep=parsed["keep"],
                sample_s=parsed["sample_interval"],
                backend=parsed["backend"],
                force=parsed["force"],
                psi_triggers=parsed["psi"] == "trigger",
                watchdog=watchdog,
                metrics=parsed["metrics"],
                isolate_compile=True,  # a miss compiles in a child: this process stays lean
                debug=parsed["debug"],
            ),
        )
    finally:
        watchdog.disarm()  # a no-op when the supervisor did it; never left waiting


def _interrupted(err: KeyboardInterrupt) -> str:
    """What an interrupted launch says: which signal, and that nothing stayed applied."""
    import signal

    signum = getattr(err, "signum", signal.SIGINT)
    return (
        f"interrupted by {signal.Signals(signum).name}: the limits applied so far were rolled back"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (the typer path exits itself)."""
    args = sys.argv[1:] if argv is None else list(argv)
    lean = _lean(args)
    if lean is None:
        from governor.cli.app import main as cli_main

        cli_main(args)
        return 0
    runner, parsed = lean
    from governor.errors import GovernorError, Reported, report

    try:
        return int(runner(parsed))
    except Reported as err:  # the compile child printed it
        return err.exit_code
    except GovernorError as err:
        return report(err, debug=parsed["debug"])
    except KeyboardInterrupt as err:
        sys.stderr.write(f"governor: {_interrupted(err)}\n")
        return int(getattr(err, "exit_code", 130))


def run() -> None:
    """The console script. After a launch the interpreter's teardown (40-80 ms of module and
    object finalisation here) has nothing left to do: every file is closed and every cgroup
    removed, so the process ends with _exit once the standard streams are flushed."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
