"""The prompt cache by build (issue 45 item 4, governor/engines/cache_build.py): the build number
from `--version`, the warning for an engine whose --cache-ram is no hard cap, a --cache-ram
below one full slot state, and init's cap in whole states. Needs: nothing (pure), the CLI for
check and init on a fixture host with a tiny GGUF."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from governor.engines import estimate as em
from governor.engines import settings as es
from governor.engines.cache_build import (
    CACHE_RAM_HARD_CAP_BUILD,
    cache_warnings,
    engine_build,
    parse_build,
    slot_state_bytes,
)
from governor.engines.gguf import GgufInfo, Tensor
from governor.engines.llama import parse_llama_argv

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"


def _est(*argv: str) -> em.Estimate:
    n_layer, d = 8, 512
    t = tuple(Tensor(f"blk.{i}.ffn_up.weight", "F16", d * d, 2 * d * d, d) for i in range(n_layer))
    info = GgufInfo(
        path="m.gguf", file_bytes=4 * MIB, architecture="llama", n_layer=n_layer, n_embd=d,
        n_head=8, n_head_kv=8, n_ctx_train=8192, vocab=1000, key_length=64, value_length=64,
        file_type="F16", tensors=t,
    )  # fmt: skip
    args = parse_llama_argv(["llama-server", "-m", "m.gguf", *argv])
    return em.estimate(info, es.settings_from_argv(args, 8192), family="none")


@pytest.mark.parametrize(
    ("text", "build"),
    [
        ("version: 0.5.0-dev (build 11312, commit 0c1e57098)\nbuilt with GNU 12.2.0\n", 11312),
        ("version: 6123 (abc1234)\nbuilt with cc\n", 6123),
        ("version: 0.5.0-dev (build 0, commit 0c1e57098)\n", None),  # no number baked in
        ("llama-server: unknown option --version\n", None),
        ("", None),
    ],
)
def test_the_build_number_is_read_from_version(text: str, build: int | None) -> None:
    assert parse_build(text) == build


def test_engine_build_runs_version_and_a_missing_engine_is_unknown() -> None:
    def run(argv: list[str], **_kw: Any) -> subprocess.CompletedProcess[bytes]:
        assert argv[1:] == ["--version"]
        return subprocess.CompletedProcess(argv, 0, b"", b"version: 9908 (deadbee)\n")

    assert engine_build("/opt/llama-server", run) == 9908
    assert engine_build("/nonexistent/llama-server") is None


def test_a_cache_ram_that_is_no_hard_cap_is_warned_about_by_build() -> None:
    est = _est("-c", "4096", "-np", "1", "--cache-ram", "512")
    old, = cache_warnings(est, CACHE_RAM_HARD_CAP_BUILD - 1)  # fmt: skip
    assert f"hard cap only from llama.cpp b{CACHE_RAM_HARD_CAP_BUILD} (PR #25070)" in old
    assert f"it is build {CACHE_RAM_HARD_CAP_BUILD - 1}" in old
    assert "its build is unknown" in cache_warnings(est, None)[0]
    assert cache_warnings(est, CACHE_RAM_HARD_CAP_BUILD) == []
    assert cache_warnings(_est("-c", "4096", "--cache-ram", "0"), None) == []  # no cache
    assert cache_warnings(_est("-c", "4096", "--cache-ram", "-1"), None) == []  # said elsewhere


def test_a_cache_ram_below_one_full_slot_state_is_the_cache_off_naming_the_state() -> None:
    est = _est("-c", "4096", "-np", "1", "--cache-ram", "10")
    state = slot_state_bytes(est)
    assert state == 8 * 4096 * 2 * 512 * 2  # layers x cells x K+V x n_embd_kv x f16
    (said,) = cache_warnings(est, 11312)
    assert f"below one full slot state ({state / MIB:.1f} MiB at 4096 tokens a slot)" in said
    assert cache_warnings(_est("-c", "4096", "-np", "1", "--cache-ram", "64"), 11312) == []
    # split slots: a slot's state is its share of the context
    split = _est("-c", "4096", "-np", "2", "--cache-ram", "20")
    assert slot_state_bytes(split) == state // 2 and cache_warnings(split, 11312)


def _governor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from governor.cli.app import main

    code: int | str | None = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


@pytest.fixture
def kvmodel(tmp_path: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from engine.make_gguf import main as make
    finally:
        sys.path.pop(0)
    path = tmp_path / "kv.gguf"
    make(["-o", str(path), "--preset", "tiny", "--n-layer", "8", "--n-embd", "256",
          "--n-ff", "256", "--n-ctx-train", "4096"])  # fmt: skip
    return path


def test_init_sizes_the_cap_in_whole_slot_states_and_warns_below_one(
    kvmodel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(HOSTS / "cgroup2-full")
    policy = tmp_path / "chat.toml"
    code, _out, err = _governor(
        capsys, "--root", root, "init", "--model", str(kvmodel), "--board-memory", "512M",
        "--engine-argv", "llama-server -np 1", "--name", "chat", "-o", str(policy),
    )  # fmt: skip
    assert code == 0, err
    data = policy.read_text()
    cap = int(data.split("max_cache_ram = ", 1)[1].split()[0])
    ctx = int(data.split("max_context_tokens = ", 1)[1].split()[0])
    state_mib = -(-8 * ctx * 2 * 256 * 2 // MIB)  # the tiny preset: n_embd_kv = n_embd
    assert cap > 0 and cap % state_mib == 0, (cap, state_mib)
    # a --cache-ram given below one state: the policy and stderr say the cache is off
    code, _out, err = _governor(
        capsys, "--root", root, "init", "--model", str(kvmodel), "--board-memory", "512M",
        "--engine-argv", "llama-server -np 1 --cache-ram 1", "--ctx", "4096",
    )  # fmt: skip
    assert code == 0, err
    assert "governor: warning: --cache-ram 1 MiB is below one full slot state" in err


def test_check_warns_when_the_engines_build_does_not_cap_the_cache(
    kvmodel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(HOSTS / "cgroup2-full")
    policy = tmp_path / "chat.toml"
    policy.write_text('name = "chat"\n[memory]\nmax = "1G"\n[engine]\nkind = "llama.cpp"\n')
    engine = tmp_path / "llama-server"
    engine.write_text("#!/bin/sh\necho 'version: 0.5.0-dev (build 9000, commit 0c1e57098)'\n")
    engine.chmod(0o755)
    argv = f"{engine} -m {kvmodel} -c 1024 -np 1 --cache-ram 64"
    code, out, err = _governor(capsys, "--root", root, "check", str(policy), "--engine-argv", argv)
    assert code == 0, err
    assert "is a hard cap only from llama.cpp b9908 (PR #25070) and it is build 9000" in out
    engine.write_text("#!/bin/sh\necho 'version: 0.5.0-dev (build 11312, commit 0c1e57098)'\n")
    code, out, err = _governor(capsys, "--root", root, "check", str(policy), "--engine-argv", argv)
    assert code == 0 and "hard cap" not in out, out + err
