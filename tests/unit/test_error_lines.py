"""The error contract: whatever a bad input holds (newlines in a file name, a megabyte-long key),
the CLI prints exactly one `governor:` line and one `hint:` line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from governor.errors import MESSAGE_MAX, PolicyError, one_line


def test_one_line_escapes_control_characters_and_cuts_long_text() -> None:
    assert one_line("a\nb\x00c\u2028") == "a\\nb\\x00c\\u2028"
    assert one_line("plain (x)") == "plain (x)"
    long = one_line("k" * 1_000_000)
    assert len(long) == MESSAGE_MAX and long.endswith("...")
    assert str(PolicyError("bad\nkey")) == "bad\\nkey"


def _governor(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "governor", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", ["check", "plan"])
def test_a_file_name_with_newlines_gives_one_error_line(tmp_path: Path, command: str) -> None:
    evil = tmp_path / "nl\n[Service]\nExecStartPre=x\n#.toml"
    done = _governor(command, str(evil))
    assert done.returncode == 66
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith("governor: ") and lines[1].startswith("hint: ")


def test_a_huge_key_is_not_echoed_in_full(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('name = "x"\n[memory]\n' + "k" * 200_000 + ' = "1G"\n')
    done = _governor("check", str(policy))
    assert done.returncode == 65
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr[:300]
    assert len(lines[0]) <= len("governor: ") + MESSAGE_MAX
