"""The sliding window (issue 45 item 5, governor/engines/window.py): which engines are chat
engines, init writes --context-shift for them, check warns when an interactive policy caps the
context without it. Needs: nothing (pure), the CLI on a fixture host with a tiny GGUF."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from governor.engines.window import is_chat, needs_shift, no_shift_warning, shifts

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"


@pytest.mark.parametrize(
    ("argv", "chat", "shift"),
    [
        (["/opt/llama-server", "-m", "m.gguf"], True, False),
        (["llama-server", "--context-shift"], True, True),
        (["llama-server", "--context-shift", "--no-context-shift"], True, False),
        (["llama-cli", "-m", "m.gguf"], True, False),  # conversation: llama-cli's default
        (["llama-completion", "-no-cnv", "--context-shift"], False, True),
        (["llama-completion", "--no-conversation", "-cnv"], True, False),
        (["llama-completion", "-p", "--context-shift"], True, False),  # a prompt, no flag
        (["llama-simple", "-m", "m.gguf"], False, False),
        ([], False, False),
    ],
)
def test_chat_engines_and_context_shift_are_read_with_llamas_grammar(
    argv: list[str], chat: bool, shift: bool
) -> None:
    assert (is_chat(argv), shifts(argv)) == (chat, shift)


def test_check_warns_only_for_an_interactive_capped_chat_without_shift() -> None:
    said = no_shift_warning(["llama-server"], 4096, "interactive")
    assert said is not None and "engine.max_context_tokens = 4096" in said
    assert "pass --context-shift" in said
    assert no_shift_warning(["llama-server", "--context-shift"], 4096, "interactive") is None
    assert no_shift_warning(["llama-server"], None, "interactive") is None  # not capped
    assert no_shift_warning(["llama-server"], 4096, "background") is None
    assert no_shift_warning(["llama-completion", "-no-cnv"], 4096, "interactive") is None
    assert needs_shift(["llama-server"]) and not needs_shift(["llama-server", "--no-context-shift"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from engine.make_gguf import main as make
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("model") / "tiny.gguf"
    assert make(["--preset", "tiny", "-o", str(out)]) == 0
    return out


def _governor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from governor.cli.app import main

    code: int | str | None = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


@pytest.mark.parametrize(
    ("engine", "written"),
    [
        ("llama-server -np 1", True),
        ("llama-completion", True),
        ("llama-completion -no-cnv", False),
        ("llama-server --no-context-shift", False),
    ],
)
def test_init_writes_context_shift_for_a_chat_engine_and_check_accepts_it(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str, written: bool
) -> None:
    root = str(HOSTS / "cgroup2-full")
    policy = tmp_path / "chat.toml"
    code, out, err = _governor(
        capsys, "--root", root, "init", "--model", str(tiny), "--board-memory", "1G",
        "--engine-argv", engine, "--class", "interactive", "-o", str(policy),
    )  # fmt: skip
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("next: "))
    assert ("--context-shift" in line.split("--engine-argv", 1)[1]) is written, line
    argv = line.split("--engine-argv ", 1)[1].strip("'")
    code, out, err = _governor(capsys, "--root", root, "check", str(policy),
                               "--allow-missing", "memory,cpuset", "--engine-argv", argv)  # fmt: skip
    assert code == 0, err
    warned = "without --context-shift" in out
    assert warned is (not written and "-no-cnv" not in engine), out
