"""The manual's generated files (governor/cli/manual) are current, complete and well formed: the
man pages, docs/reference/policy.md and the completion scripts are what `python -m
governor.cli.manual` writes now, so a new command, option or policy key cannot be left out."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import typer

from governor.cli.app import app
from governor.cli.manual import keys, policyref
from governor.cli.manual.__main__ import main as manual_main
from governor.cli.manual.generate import MAN1, MAN5, POLICY_MD, generated
from governor.policy.model import Policy

REPO = Path(__file__).resolve().parents[3]


def _unroff(text: str) -> str:
    return text.replace("\\-", "-").replace("\\e", "\\").replace("\\fB", "").replace("\\fR", "")


def test_the_committed_files_are_what_the_generator_writes_now() -> None:
    stale = [rel for rel, text in generated().items() if (REPO / rel).read_text() != text]
    assert not stale, (
        f"{stale} are stale: run `python -m governor.cli.manual` and commit the result"
    )


def test_check_names_a_stale_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rel, text in generated().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / MAN1).write_text("old\n")
    assert manual_main(["--check", "--root", str(tmp_path)]) == 1
    assert f"{MAN1}: not current" in capsys.readouterr().out
    assert (tmp_path / MAN1).read_text() == "old\n"
    assert manual_main(["--root", str(tmp_path)]) == 0
    assert manual_main(["--check", "--root", str(tmp_path)]) == 0


def _walk(cmd: click.Command, ctx: click.Context) -> list[tuple[click.Context, click.Command]]:
    out = [(ctx, cmd)]
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None
            out += _walk(sub, click.Context(sub, info_name=name, parent=ctx))
    return out


def test_man1_has_every_command_argument_and_option() -> None:
    page = _unroff(generated()[MAN1])
    root = typer.main.get_command(app)
    commands = _walk(root, click.Context(root, info_name="governor"))
    assert len(commands) > 20
    for ctx, cmd in commands:
        assert f'.SS "{ctx.command_path}"' in page or ctx.command_path == "governor"
        for param in cmd.get_params(ctx):
            if isinstance(param, click.Option) and "--help" not in param.opts:
                for opt in param.opts:
                    assert opt in page, f"{ctx.command_path}: {opt} missing from governor(1)"
            elif isinstance(param, click.Argument):
                assert param.make_metavar(ctx) in page


def test_man1_gives_the_arguments_their_help() -> None:
    """typer-slim 0.21 on click 8.5 loses an argument's help (`--help` lists it bare): the
    page reads it from the command's function."""
    page = _unroff(generated()[MAN1])
    assert "NAME\npolicy name of a governed slice" in page
    assert "POLICY\npolicy TOML file" in page


def _in_section(entry: policyref.Entry) -> dict[str, Any]:
    """A whole policy around the entry's example line, as a user would write it."""
    value = tomllib.loads(entry.example)
    doc: dict[str, Any] = {"name": "example"}
    if not entry.section:
        doc.update(value)
    elif entry.section in policyref.ARRAY_SECTIONS:
        doc[entry.section] = [{"when": "memory some 150ms/2s", "do": ["log"], **value}]
    else:
        doc[entry.section] = value
    return doc


def test_every_policy_key_is_described_with_an_example_that_validates() -> None:
    items = policyref.entries()
    paths = {e.path for e in items}
    assert paths == set(keys.KEYS), (
        f"undescribed keys: {sorted(paths - set(keys.KEYS))};"
        f" described keys the schema does not have: {sorted(set(keys.KEYS) - paths)}"
    )
    assert {e.section for e in items} == set(keys.SECTIONS)
    for entry in items:
        assert entry.text and entry.type and entry.example, entry.path
        assert entry.example.split("=", 1)[0].strip() == entry.key, entry.path
        Policy.model_validate(_in_section(entry))


def test_the_reference_shows_types_defaults_and_bounds_from_the_schema() -> None:
    by_path = {e.path: e for e in policyref.entries()}
    assert by_path["cpu.weight"].type == "integer 1 to 10000"
    assert by_path["process.on_governor_exit"].type == '"kill" | "keep"'
    assert by_path["process.on_governor_exit"].default == '"kill"'
    assert by_path["engine.ready_timeout"].default == '"300s"'
    assert by_path["name"].required
    assert by_path["qos.yield"].default == '["unload", "throttle", "freeze", "stop", "kill"]'
    md = generated()[POLICY_MD]
    assert "### `memory.high`" in md and "## [[pressure]]" in md


@pytest.mark.parametrize("rel", [MAN1, MAN5])
def test_the_man_pages_render_without_warnings(rel: str) -> None:
    man = shutil.which("man")
    if man is None:
        pytest.skip("man (man-db) is not installed")
    run = subprocess.run(
        [man, "--warnings", "-l", str(REPO / rel)],
        capture_output=True,
        text=True,
        env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin", "MANPAGER": "cat", "LANG": "C.UTF-8"},
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == "", run.stderr
    assert "governor" in run.stdout


def test_the_reference_page_has_no_bare_angle_brackets() -> None:
    """MkDocs passes `<slice>` outside a code span through as an HTML tag: the text vanishes."""
    import re

    body = generated()[POLICY_MD].split("-->", 1)[1]
    outside = re.sub(r"`[^`]*`", "", body)
    assert "<" not in outside and ">" not in outside.replace("->", "")
