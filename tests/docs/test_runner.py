"""The docs' runner (tests/docs/runner.py) on synthetic pages: what makes a block fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from docs import blocks, runner


def _run(page: str, tmp_path: Path) -> list[str]:
    cmds = [c for b in blocks.parse(page, "p.md") for c in b.commands]
    return runner.run("p.md", cmds, tmp_path / "work", timeout=60)


@pytest.mark.parametrize("line", ["false | true", "true | false | true", "true | false"])
def test_an_sh_pipeline_with_a_failing_command_fails_the_block(line: str, tmp_path: Path) -> None:
    """Without pipefail `false | true` exits 0 and an sh block, whose output is not compared,
    passes while its first command fails (issue 43 item 13)."""
    problems = _run(f"```sh\ntrue\n{line}\n```\n", tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"p.md:3: $ {line}: exit 1,"), problems


def test_a_console_pipeline_reports_the_failing_commands_exit_code(tmp_path: Path) -> None:
    page = "```console\n$ (echo out; exit 3) | cat\nout\n[exit 3]\n$ true | true\n```\n"
    assert _run(page, tmp_path) == []
