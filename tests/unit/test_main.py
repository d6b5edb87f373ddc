"""The lean launch command line (governor/main.py parse_launch) against the typer CLI
(governor/cli/app.py): for the forms the lean parser accepts, both paths call governor.api.launch
with the same policy, engine argv, host options, launch options and log level; every form it
is unsure of (help, a typo, a bad choice or range) goes to typer, which prints the usage error
and exits 2, without launching anything.

governor.api.launch is replaced by a recorder (the boundary both paths call); nothing is
applied. The lean path forks its real /bin/sh watchdog and disarms it. Needs /bin/sh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from governor import log, main
from governor.api import launch as api
from governor.cli import app as cli
from governor.cli.options import STATE
from governor.record import replace

Call = tuple[Path, tuple[str, ...], Any, Any, int]  # path, argv, HostOptions, LaunchOptions, level


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """api.launch records its arguments (the watchdog left out) and the log threshold."""
    recorded: list[Call] = []

    def record(path: Path, argv: tuple[str, ...], opts: Any, lopts: Any) -> int:
        recorded.append((path, argv, opts, replace(lopts, watchdog=None), log._CONFIG.threshold))
        return 0

    monkeypatch.setattr(api, "launch", record)
    # both paths configure logging and typer's global state: restored after the test
    monkeypatch.setattr(log._CONFIG, "threshold", log._CONFIG.threshold)
    for attr in ("debug", "root", "cgroup_root"):
        monkeypatch.setattr(STATE, attr, getattr(STATE, attr))
    return recorded


def _typer(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    code = info.value.code
    return code if isinstance(code, int) else 1


COMMON_FORMS = {
    "long-policy-with-dashdash": ["launch", "--policy", "p.toml", "--", "sleep", "1"],
    "short-policy-no-dashdash": ["launch", "-p", "p.toml", "sleep", "1"],
    "equals-forms-and-flags": [
        "launch",
        "--policy=p.toml",
        "--report=r.json",
        "--keep",
        "--force",
        "--allow-missing=memory,cpu",
        "--sample-interval=0.5",
        "--backend=systemd",
        "--psi=poll",
        "--",
        "engine",
        "--keep",
    ],
    "global-options-first": [
        "--debug",
        "--root",
        "/tmp/root",
        "--cgroup-root=/sys/fs/cgroup/unified",
        "launch",
        "-p",
        "p.toml",
        "--report",
        "r.json",
        "--sample-interval",
        "2",
        "--backend",
        "auto",
        "--psi",
        "trigger",
        "engine",
        "-p",
        "x",
    ],
    "allow-missing-with-spaces-and-psi": [
        "launch",
        "-p",
        "p.toml",
        "--allow-missing",
        " memory , psi ",
        "--",
        "e",
    ],
    "lowest-sample-interval": ["launch", "-p", "p.toml", "--sample-interval", "0.05", "e"],
    "engine-options-after-dashdash": ["launch", "-p", "p.toml", "--", "-x", "--help", "-h"],
    "engine-starts-with-dash": ["launch", "-p", "p.toml", "-", "rest"],
    "second-dashdash-is-the-engines": ["launch", "-p", "p.toml", "e", "--", "x"],
    "dashdash-twice": ["launch", "-p", "p.toml", "--", "--", "e"],
    "metrics-port": ["launch", "-p", "p.toml", "--metrics", "9101", "e"],
    "metrics-ipv6-equals": ["launch", "-p", "p.toml", "--metrics=[::1]:9101", "--", "e"],
}


@pytest.mark.parametrize("args", COMMON_FORMS.values(), ids=COMMON_FORMS.keys())
def test_the_lean_path_launches_exactly_what_typer_launches(
    calls: list[Call], args: list[str]
) -> None:
    main.parse_launch(args)  # the lean path takes it (no _Fallback), else this proves nothing
    assert main.main(args) == 0
    assert _typer(args) == 0
    assert len(calls) == 2
    lean, typer = calls
    assert lean == typer


def test_the_parsed_values_are_those_of_the_command_line() -> None:
    parsed = main.parse_launch(COMMON_FORMS["global-options-first"])
    assert parsed["debug"] is True
    assert (parsed["root"], parsed["cgroup_root"]) == ("/tmp/root", "/sys/fs/cgroup/unified")
    assert (parsed["policy"], parsed["report"]) == ("p.toml", "r.json")
    assert (parsed["sample_interval"], parsed["backend"], parsed["psi"]) == (2.0, "auto", "trigger")
    assert parsed["engine"] == ("engine", "-p", "x")
    assert parsed["allow_missing"] == frozenset()


def test_metrics_comes_from_the_option_or_the_environment_on_both_paths(
    calls: list[Call], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main.parse_launch(COMMON_FORMS["metrics-port"])["metrics"] == ("127.0.0.1", 9101)
    assert main.parse_launch(["launch", "-p", "p", "e"])["metrics"] is None
    monkeypatch.setenv("GOVERNOR_METRICS", "0.0.0.0:9102")  # the governor@ unit's .env file
    args = ["launch", "-p", "p.toml", "e"]
    assert main.parse_launch(args)["metrics"] == ("0.0.0.0", 9102)
    assert main.main(args) == 0
    assert _typer(args) == 0
    assert [c[3].metrics for c in calls] == [("0.0.0.0", 9102)] * 2


FALLBACK_USAGE_ERRORS = {
    "unknown-option": ["launch", "-p", "p.toml", "--bogus", "--", "e"],
    "bad-backend": ["launch", "-p", "p.toml", "--backend", "docker", "--", "e"],
    "bad-psi": ["launch", "-p", "p.toml", "--psi=sometimes", "--", "e"],
    "sample-interval-below-minimum": ["launch", "-p", "p.toml", "--sample-interval", "0.01", "e"],
    "sample-interval-not-a-number": ["launch", "-p", "p.toml", "--sample-interval=fast", "e"],
    "unknown-allow-missing": ["launch", "-p", "p.toml", "--allow-missing", "gpu", "--", "e"],
    "no-policy": ["launch", "--", "e"],
    "no-engine": ["launch", "-p", "p.toml", "--"],
    "policy-without-value": ["launch", "-p"],
    "flag-with-value": ["launch", "-p", "p.toml", "--keep=yes", "--", "e"],
    "global-option-after-launch": ["launch", "--debug", "-p", "p.toml", "--", "e"],
    "unknown-global-option": ["--verbose", "launch", "-p", "p.toml", "--", "e"],
    "short-h-is-no-help-option": ["launch", "-h", "-p", "p.toml", "e"],
    "metrics-port-out-of-range": ["launch", "-p", "p.toml", "--metrics", "99999", "e"],
    "metrics-without-port": ["launch", "-p", "p.toml", "--metrics", "127.0.0.1:", "e"],
}


@pytest.mark.parametrize("args", FALLBACK_USAGE_ERRORS.values(), ids=FALLBACK_USAGE_ERRORS.keys())
def test_what_the_lean_parser_refuses_goes_to_typer_which_says_usage_and_exits_2(
    calls: list[Call], args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(main._Fallback):
        main.parse_launch(args)
    with pytest.raises(SystemExit) as info:
        main.main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("governor: "), err
    assert "Traceback" not in err
    assert calls == []


@pytest.mark.parametrize(
    "args",
    [
        ["launch", "--help"],
        ["launch", "-p", "p.toml", "--help"],
        ["launch", "--help", "-p", "p", "e"],
    ],
    ids=["help", "help-last", "help-before-engine"],
)
def test_help_for_launch_is_typers_and_launches_nothing(
    calls: list[Call], args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main.main(args)
    assert info.value.code == 0
    assert "--sample-interval" in capsys.readouterr().out
    assert calls == []


def test_help_as_an_option_value_takes_the_typer_path_which_reads_it_as_the_value(
    calls: list[Call],
) -> None:
    args = ["launch", "--report", "--help", "-p", "p.toml", "--", "e"]
    main.parse_launch(args)  # the lean parser would take it, but main sees --help and defers
    with pytest.raises(SystemExit) as info:  # typer's exit: the lean path returns instead
        main.main(args)
    assert info.value.code == 0
    assert [c[3].report for c in calls] == [Path("--help")]


# --- the lean status (issue 47 item 3) ----------------------------------------------------------

STATUS_FORMS = {
    "bare": ["status"],
    "name": ["status", "chat"],
    "json-before-name": ["status", "--json", "chat"],
    "name-then-flags": ["status", "chat", "--prune", "--json"],
    "global-root": ["--root", "/tmp/board", "status"],
    "global-root-equals-debug": ["--debug", "--root=/tmp/board", "status", "--json"],
}


@pytest.mark.parametrize("args", list(STATUS_FORMS.values()), ids=list(STATUS_FORMS))
def test_the_lean_status_asks_and_prints_exactly_what_typers_does(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from governor.api import operate as api_operate

    asked: list[tuple[Any, ...]] = []
    items = [{"name": "chat", "pid": 7, "limits": {"memory.max": 1 << 30}}]

    def status(name: str | None, *, prune: bool, root: Path) -> list[dict[str, Any]]:
        asked.append((name, prune, root, log._CONFIG.threshold))
        return items

    monkeypatch.setattr(api_operate, "status", status)
    monkeypatch.setattr("governor.operate.status.render", lambda i: f"rendered {len(i)}\n")
    monkeypatch.setattr(log._CONFIG, "threshold", log._CONFIG.threshold)
    for attr in ("debug", "root", "cgroup_root"):
        monkeypatch.setattr(STATE, attr, getattr(STATE, attr))
    assert main._lean(args) is not None and main._lean(args)[0] is main._status  # type: ignore[index]
    assert main.main(args) == 0
    lean = capsys.readouterr()
    assert _typer(args) == 0
    typer_out = capsys.readouterr()
    assert asked[0] == asked[1] and len(asked) == 2
    assert (lean.out, lean.err) == (typer_out.out, typer_out.err)
    assert lean.out.startswith("[\n") if "--json" in args else lean.out == "rendered 1\n"


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--help"],
        ["status", "a", "b"],  # two names
        ["status", "--bogus"],
        ["status", "--", "chat"],
        ["--cgroup-root", "/x", "status"],  # a global option status has no use for: typer's
        ["--root"],
        ["estimate", "status"],  # a value, not the command
        ["board", "--fits", "status"],
    ],
)
def test_what_the_lean_status_parser_is_unsure_of_goes_to_typer(args: list[str]) -> None:
    assert main._lean(args) is None


def test_a_status_error_is_the_same_one_line_and_exit_code_on_both_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(log._CONFIG, "threshold", log._CONFIG.threshold)
    for attr in ("debug", "root", "cgroup_root"):
        monkeypatch.setattr(STATE, attr, getattr(STATE, attr))
    assert main.main(["status", "nosuch"]) == 66
    lean = capsys.readouterr()
    assert _typer(["status", "nosuch"]) == 66
    assert lean.err == capsys.readouterr().err
    assert lean.err.startswith("governor: no governed slice named nosuch (")
