"""`governor --version` / `-V` (issue 43, low): ``governor 0.2.0`` from the installed
distribution (cgroup-governor), else the package's __version__, on both entry paths: the
console script's (governor/main.py, which sends everything but a launch to typer) and the typer
app's. Needs: nothing."""

from __future__ import annotations

from importlib import metadata

import pytest

import governor
from governor import main as entry
from governor.cli import app as cli


def _run(capsys: pytest.CaptureFixture[str], fn: object, argv: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        fn(argv)  # type: ignore[operator]
    out, err = capsys.readouterr()
    assert err == ""
    code = info.value.code
    assert isinstance(code, int)
    return code, out


@pytest.mark.parametrize("flag", ["--version", "-V"])
@pytest.mark.parametrize("fn", [cli.main, entry.main], ids=["typer", "console-script"])
def test_version_prints_the_distribution_version(
    capsys: pytest.CaptureFixture[str], fn: object, flag: str
) -> None:
    assert _run(capsys, fn, [flag]) == (0, f"governor {governor.__version__}\n")


def test_version_before_a_launch_command_line_is_still_the_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The lean path parses only launches; it hands this one to typer, which answers first."""
    got = _run(capsys, entry.main, ["--version", "launch", "-p", "x.toml", "--", "true"])
    assert got == (0, f"governor {governor.__version__}\n")


def test_version_from_the_installed_distribution_else_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metadata, "version", lambda name: {"cgroup-governor": "9.9.9"}[name])
    assert cli.version_line() == "governor 9.9.9"

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert cli.version_line() == f"governor {governor.__version__}"


def test_help_lists_the_version_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, cli.main, ["--help"])
    assert code == 0 and "--version" in out and "-V" in out
