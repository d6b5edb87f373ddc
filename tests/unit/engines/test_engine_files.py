"""The engine's own files in the estimate (governor/engines/engine_files.py, the `engine` term):
after a cold cache its binary and the libraries beside it are file pages charged to its
cgroup, like the model's; a program not found on disk gets the largest binary measured."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from governor.engines import estimate as em
from governor.engines.budget import estimate_argv
from governor.engines.engine_files import engine_file_bytes
from governor.engines.llama import parse_llama_argv
from governor.engines.settings import Settings

from .test_estimate import _make, _qwen18b

MIB = 1 << 20


def _engine_dir(root: Path) -> Path:
    bin_dir = root / "opt" / "llama" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-server").write_bytes(b"\0" * 3000)
    (bin_dir / "libllama.so").write_bytes(b"\0" * 500)
    (bin_dir / "libggml-base.so.0.9").write_bytes(b"\0" * 70)
    os.symlink("libggml-base.so.0.9", bin_dir / "libggml-base.so")  # counted once
    (bin_dir / "README.md").write_bytes(b"\0" * 9)  # not a library
    return bin_dir


def test_the_binary_and_the_libraries_beside_it_are_counted_once_each(tmp_path: Path) -> None:
    _engine_dir(tmp_path)
    assert engine_file_bytes("/opt/llama/bin/llama-server", root=tmp_path) == 3570
    # relative to the working directory, and through a symlink to the binary
    assert engine_file_bytes("bin/llama-server", root=Path("/"), cwd=tmp_path / "opt/llama") == 3570
    os.symlink(tmp_path / "opt/llama/bin/llama-server", tmp_path / "srv")
    assert engine_file_bytes("./srv", root=Path("/"), cwd=tmp_path) == 3570


def test_a_bare_name_or_a_missing_program_is_not_found(tmp_path: Path) -> None:
    _engine_dir(tmp_path)
    assert engine_file_bytes("llama-server", root=tmp_path) is None
    assert engine_file_bytes("/opt/llama/bin/llama-cli", root=tmp_path) is None
    assert engine_file_bytes("/opt/llama/bin", root=tmp_path) is None  # a directory


def test_the_engine_term_is_the_files_found_else_the_largest_measured() -> None:
    s = Settings(ctx=2048)
    found = em.estimate(_qwen18b(), replace(s, engine_files=7 * MIB), family="none")
    assert found.term("engine") == 7 * MIB
    unknown = em.estimate(_qwen18b(), s, family="none")
    assert unknown.term("engine") == em.ENGINE_FILE_BYTES
    assert unknown.total - found.total == em.ENGINE_FILE_BYTES - 7 * MIB


def test_estimate_argv_reads_the_program_of_the_argv(tmp_path: Path) -> None:
    model = _make(tmp_path)
    _engine_dir(tmp_path / "root")
    argv = f"/opt/llama/bin/llama-server -m {model} -c 512 --cache-ram 0"
    est = estimate_argv(parse_llama_argv(argv.split()), root=tmp_path / "root", budget=None)
    assert est.term("engine") == 3570
    assert est.settings.engine_files == 3570
    bare = argv.replace("/opt/llama/bin/llama-server", "llama-server")
    bare_est = estimate_argv(parse_llama_argv(bare.split()), root=tmp_path / "root", budget=None)
    assert bare_est.term("engine") == em.ENGINE_FILE_BYTES
