"""board-install.sh as text (host, quick): it installs this repository's wheel by its path, as
the docs do, and never a distribution by name from an index (issue 43: with no WHEELHOUSE it
ran `pip install cgroup-governor`, which fetches whatever PyPI holds under that name). The
install itself runs in tests/install/test_board_install.py (a chroot, minutes)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "board-install.sh"


def _pip_installs(text: str) -> list[list[str]]:
    """The words of each `pip install` command of the script (comments dropped)."""
    out = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        for n, word in enumerate(words[:-1]):
            if re.fullmatch(r"(\S*/)?pip3?", word) and words[n + 1] == "install":
                out.append(words[n + 2 :])
    return out


# a requirement by name (PEP 508: a name, extras, a version), as an index resolves it
BY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[\w,.-]+\])?([<>=!~]=?\S+)?")


def _by_name(words: list[str]) -> list[str]:
    return [w for w in words if not w.startswith("-") and BY_NAME.fullmatch(w)]


def test_every_pip_install_names_a_wheel_path_never_a_distribution() -> None:
    installs = _pip_installs(SCRIPT.read_text())
    assert installs, "board-install.sh installs nothing with pip?"
    assert all(words and not _by_name(words) for words in installs), installs


def test_the_no_wheelhouse_branch_builds_the_checkout() -> None:
    text = SCRIPT.read_text()
    assert re.search(r'pip wheel --no-deps --wheel-dir "\$dist" "\$REPO"', text)
    assert "cgroup-governor" not in " ".join(shlex.split(text, comments=True))


def test_the_script_parses() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run(
        [bash, "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_reader_sees_the_old_by_name_install() -> None:
    old = '/opt/governor/bin/pip install "${pip_from[@]}" cgroup-governor\n'
    assert _by_name(*_pip_installs(old)) == ["cgroup-governor"]
    assert _by_name(["--no-index", "cgroup-governor[systemd]>=0.2", "./dist/x.whl"]) == [
        "cgroup-governor[systemd]>=0.2"
    ]
