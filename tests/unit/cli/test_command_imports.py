"""What a governor process imports before it does anything (issue 47 item 3): every command is
a fresh interpreter, and under the test guests' emulation each module costs tens of ms (pydantic
alone ~2 s, the policy models ~3 s more: docs/development.md, "What each tier costs"). These
tests hold the line by structure, not by the clock: the commands that read no policy never
import pydantic, the policy models or the compiler; the ones that do build the models without
pydantic's plugin scan; and the venv's Python starts without setuptools' editable finder."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BOARD = REPO / "tests/fixtures/hosts/rk3588"
POLICY = REPO / "policies/dev-box.toml"

# run one command in a fresh interpreter and write what it imported (name -> file, None for a
# module with no file) as JSON
PROBE = """
import json, sys
from governor.main import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
with open(sys.argv[1], "w") as out:
    json.dump({n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}, out)
"""

# the compile-time stack: what a command that reads no policy must not pay for
COMPILE_STACK = (
    "pydantic",
    "governor.policy.model",
    "governor.compile.compiler",
    "governor.engines.estimate",
    "importlib.metadata",
)


def imported(tmp_path: Path, *argv: str) -> dict[str, str | None]:
    out = tmp_path / "modules.json"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(tmp_path / "run")}
    env.pop("PYDANTIC_DISABLE_PLUGINS", None)  # the plugin scan is the code's to skip
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.exists(), run.stderr
    modules: dict[str, str | None] = json.loads(out.read_text())
    return modules


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("--root", str(BOARD), "status"),
        ("--root", str(BOARD), "board"),
        ("--root", str(BOARD), "doctor"),
        ("--root", str(BOARD), "doctor", "--json"),
        ("--root", str(BOARD), "top", "-b", "-n", "1"),
    ],
    ids=["help", "status", "board", "doctor", "doctor-json", "top"],
)
def test_a_command_that_reads_no_policy_never_imports_the_compile_time_stack(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    modules = imported(tmp_path, *argv)
    assert "governor.main" in modules  # the probe ran the command
    assert not [m for m in COMPILE_STACK if m in modules]


def test_status_takes_the_lean_path_without_typer_or_click(tmp_path: Path) -> None:
    """governor/main.py _status: each `status` of the guest tests paid ~2 s for typer and
    click (docs/development.md, "What each tier costs")."""
    modules = imported(tmp_path, "--root", str(BOARD), "status", "--json")
    assert "governor.operate.status" in modules  # the probe ran the command
    assert not [m for m in ("typer", "click", "governor.cli.app") if m in modules]


def test_check_builds_the_policy_models_without_pydantics_plugin_scan(tmp_path: Path) -> None:
    modules = imported(tmp_path, "--root", str(BOARD), "check", str(POLICY))
    assert "governor.compile.compiler" in modules  # the policy was compiled ...
    assert "governor.policy.model" in modules  # ... through the models
    # without --engine-argv no model file is read and no policy drafted (api/check.py)
    assert not [m for m in ("governor.engines.estimate", "governor.init.draft") if m in modules]
    # the scan reads every installed distribution's entry points through importlib.metadata
    assert "importlib.metadata" not in modules
    loader = "pydantic.plugin._loader"
    assert loader in modules  # pydantic asked for its plugins ...
    assert modules[loader] is None  # ... and found governor/policy/noplugins.py's loader


def test_the_venvs_python_starts_without_setuptools_editable_finder() -> None:
    # an editable install's finder (setuptools' default mode for this flat layout) is imported
    # by every Python process of the venv from its .pth, with pathlib, re and urllib: half of
    # the interpreter's start in the test guests. scripts/setup installs with a path .pth
    finders = [
        f"{pth.name}: {line[:60]}"
        for sp in site.getsitepackages()
        for pth in sorted(Path(sp).glob("*.pth"))
        for line in pth.read_text(errors="replace").splitlines()
        if line.startswith("import") and "__editable__" in line and "governor" in line
    ]
    assert not finders, f"rerun scripts/setup (it installs with editable_mode=compat): {finders}"
    assert not [m for m in sys.modules if m.startswith("__editable__")]
    import governor

    assert Path(governor.__file__).resolve().is_relative_to(REPO)
