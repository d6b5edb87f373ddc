"""Shell completion as a shell runs it: bash sources the generated script (share/) and calls its
function with COMP_WORDS, the script asks `governor` (this tree's code) over click's protocol,
and the answers include the governed policies' names and the policy files. zsh and fish are
asked over their own protocol (their shells are not on every host)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from governor.cli.complete import INSTALLED, policy_files, policy_names
from governor.cli.manual.generate import BASH
from governor.deploy.install import MANIFEST_DIR

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def board(tmp_path: Path) -> dict[str, str]:
    """A run dir with two governed policies, a work dir with policy files, and `governor` on
    PATH running this tree."""
    run = tmp_path / "run"
    for name in ("npu-chat", "dev-box"):
        (run / name).mkdir(parents=True)
        (run / name / "state.json").write_text("{}")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "chat.toml").write_text("")
    (work / "notes.txt").write_text("")
    (work / ".hidden.toml").write_text("")
    (work / "sub" / "batch.toml").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "governor"
    shim.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from governor.main import run\nrun()\n"
    )
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("_GOVERNOR")}
    env.update(
        {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "GOVERNOR_RUN_DIR": str(run),
            "PWD": str(work),
        }
    )
    return env


def bash_complete(env: dict[str, str], line: str) -> list[str]:
    """COMPREPLY for the command line `line` (the cursor at its end)."""
    bash = shutil.which("bash")
    assert bash is not None
    script = (
        f'source "{REPO / BASH}"\n'
        'read -r -a COMP_WORDS <<< "$LINE"\n'
        '[ "${LINE: -1}" = " " ] && COMP_WORDS+=("")\n'
        "COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n"
        "_governor_completion governor\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    run = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", script],
        env={**env, "LINE": line},
        cwd=env["PWD"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == "", run.stderr
    return [w for w in run.stdout.splitlines() if w]


def test_bash_completes_the_commands(board: dict[str, str]) -> None:
    assert bash_complete(board, "governor sta") == ["status"]
    assert {"rollback", "render"} <= set(bash_complete(board, "governor r"))


def test_bash_completes_governed_policy_names(board: dict[str, str]) -> None:
    assert {"dev-box", "npu-chat"} <= set(bash_complete(board, "governor status "))
    assert bash_complete(board, "governor tune np") == ["npu-chat"]
    assert bash_complete(board, "governor rollback dev") == ["dev-box"]


def test_bash_completes_policy_files_for_check_and_launch(board: dict[str, str]) -> None:
    assert bash_complete(board, "governor check ") == ["chat.toml", "sub/"]
    assert bash_complete(board, "governor check sub/") == ["sub/batch.toml"]
    assert bash_complete(board, "governor launch -p ") == ["chat.toml", "sub/"]
    assert bash_complete(board, "governor launch --policy c") == ["chat.toml"]
    assert {"--policy", "--psi"} <= set(bash_complete(board, "governor launch --p"))


@pytest.mark.parametrize(
    ("shell", "extra"),
    [("zsh", {"COMP_WORDS": "governor status ", "COMP_CWORD": "2"}),
     ("fish", {"COMP_WORDS": "governor status ", "COMP_CWORD": ""})],
)  # fmt: skip
def test_zsh_and_fish_get_the_policy_names(
    board: dict[str, str], shell: str, extra: dict[str, str]
) -> None:
    run = subprocess.run(
        ["governor"],
        env={**board, **extra, "_GOVERNOR_COMPLETE": f"{shell}_complete"},
        cwd=board["PWD"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "npu-chat" in run.stdout and "dev-box" in run.stdout


def test_policy_names_come_from_the_run_dir_and_the_install_manifests(tmp_path: Path) -> None:
    assert str(INSTALLED) == MANIFEST_DIR  # the completer does not import the installer
    (tmp_path / "run" / "chat").mkdir(parents=True)
    (tmp_path / "run" / ".tmp").mkdir()
    (tmp_path / MANIFEST_DIR).mkdir(parents=True)
    (tmp_path / MANIFEST_DIR / "batch.json").write_text("{}")
    (tmp_path / MANIFEST_DIR / "README").write_text("")
    assert policy_names("", tmp_path / "run", tmp_path) == ["batch", "chat"]
    assert policy_names("c", tmp_path / "run", tmp_path) == ["chat"]
    assert policy_names("", tmp_path / "missing", tmp_path / "nowhere") == []


def test_policy_files_keep_the_typed_directory(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.toml").write_text("")
    (tmp_path / "p" / "b.json").write_text("")
    assert policy_files("p/", tmp_path) == ["p/a.toml"]
    assert policy_files(f"{tmp_path}/p/a", tmp_path) == [f"{tmp_path}/p/a.toml"]
    assert policy_files("nowhere/", tmp_path) == []


def test_bash_completes_names_and_files_for_uninstall(board: dict[str, str]) -> None:
    got = bash_complete(board, "governor uninstall ")
    assert {"dev-box", "npu-chat", "chat.toml", "sub/"} <= set(got)
    assert "notes.txt" not in got


def test_bash_puts_a_file_with_glob_characters_on_the_line_literally(
    board: dict[str, str],
) -> None:
    """click's script expanded its answers (`COMPREPLY+=($value)`): a policy named `*.toml`
    completed to every TOML file, `[ab].toml` to a.toml and b.toml (issue 43). Each answer is
    one word, escaped so the shell runs it as that file's name."""
    work = Path(board["PWD"])
    for name in ("a.toml", "b.toml", "*.toml", "[ab].toml", "my policy.toml"):
        (work / name).write_text("")
    assert bash_complete(board, "governor check *") == ["\\*.toml"]
    assert bash_complete(board, "governor check [") == ["\\[ab\\].toml"]
    assert bash_complete(board, "governor launch --policy m") == ["my\\ policy.toml"]
    every = bash_complete(board, "governor check ")
    assert every[:5] == ["\\*.toml", "\\[ab\\].toml", "a.toml", "b.toml", "chat.toml"], every


def test_bash_leaves_a_typed_tilde_to_the_shell(board: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "npu.toml").write_text("")
    assert bash_complete({**board, "HOME": str(home)}, "governor check ~/n") == ["~/npu.toml"]
