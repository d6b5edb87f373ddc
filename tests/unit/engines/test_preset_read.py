"""A llama-server preset is a file another process may write (issue 43 items 3 and 12): one that
is not UTF-8, a FIFO or a symlink to /dev/zero gives `estimate`, `init` and `check
--engine-argv` one line naming it, `(--models-preset)`, a hint and 65: no traceback, no hang,
no MemoryError. The launch's plan-cache key reads it too, and skips it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from governor.cli.app import main
from governor.engines.llama import parse_llama_argv

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "tests" / "fixtures" / "hosts" / "cgroup2-full"
SERVER = "/opt/llama/bin/llama-server"
HINT = "hint: a preset is a small UTF-8 INI file of [sections] of 'key = value' lines"


def _governor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(["--root", str(ROOT), *argv])
    assert isinstance(info.value.code, int)
    return info.value.code, capsys.readouterr().err


@pytest.fixture(params=["not-utf8", "fifo", "dev-zero"])
def bad_preset(
    request: pytest.FixtureRequest, tmp_path: Path, memory_cap: None
) -> tuple[Path, str]:
    """A preset that cannot be read as one, and what the line says of it."""
    preset = tmp_path / "models.ini"
    if request.param == "not-utf8":
        preset.write_bytes(b"[tiny]\nmodel = /m/t\xff.gguf\n")
        return preset, "not UTF-8 (at byte 19)"
    if request.param == "fifo":
        os.mkfifo(preset)  # no writer: a blocking open hangs
        return preset, "a FIFO, not a file"
    preset.symlink_to("/dev/zero")  # read to EOF: MemoryError
    return preset, "a device, not a file"


def _one_line(code: int, err: str, preset: Path, problem: str) -> None:
    lines = err.splitlines()
    assert code == 65, err
    assert lines[0] == f"governor: {preset}: {problem} (--models-preset)"
    assert lines[1].startswith(HINT) and len(lines) == 2


@pytest.mark.timeout(20)
def test_estimate_names_a_bad_preset_in_one_line(
    capsys: pytest.CaptureFixture[str], bad_preset: tuple[Path, str]
) -> None:
    preset, problem = bad_preset
    code, err = _governor(capsys, "estimate", str(preset), "--engine-argv", "llama-server -c 256")
    _one_line(code, err, preset, problem)


@pytest.mark.timeout(20)
def test_init_names_a_bad_preset_in_one_line(
    capsys: pytest.CaptureFixture[str], bad_preset: tuple[Path, str], tmp_path: Path
) -> None:
    preset, problem = bad_preset
    out = tmp_path / "r.toml"
    code, err = _governor(
        capsys, "init", "--model", str(preset), "--engine-argv", SERVER, "-o", str(out)
    )
    _one_line(code, err, preset, problem)
    assert not out.exists()


@pytest.mark.timeout(20)
def test_check_engine_argv_names_a_bad_preset_in_one_line(
    capsys: pytest.CaptureFixture[str],
    bad_preset: tuple[Path, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    preset, problem = bad_preset
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    policy = tmp_path / "r.toml"
    policy.write_text('name = "r"\n[engine]\nkind = "llama.cpp"\n[memory]\nmax = "1G"\n')
    code, err = _governor(
        capsys, "check", str(policy), "--allow-missing", "memory",
        "--engine-argv", f"{SERVER} --models-preset {preset}",
    )  # fmt: skip
    _one_line(code, err, preset, problem)


@pytest.mark.timeout(20)
def test_the_launch_cache_key_skips_a_bad_preset(bad_preset: tuple[Path, str]) -> None:
    from governor.api.launch_compile import _router_inputs

    preset, _problem = bad_preset
    args = parse_llama_argv((SERVER, "--models-preset", str(preset)))
    assert _router_inputs(args, preset.parent) == [str(preset)]


def test_a_preset_over_its_cap_is_refused_before_it_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from governor.engines.router import PRESET_MAX

    preset = tmp_path / "models.ini"
    big = 64 << 20  # a preset of 64 MiB: a section a model is KiB
    with preset.open("wb") as f:
        f.truncate(big)  # sparse: the size says it all
    code, err = _governor(capsys, "estimate", str(preset), "--engine-argv", "llama-server")
    _one_line(code, err, preset, f"{big} bytes, over its cap of {PRESET_MAX}")
