"""Pure parts of governor/launch/prefetch.py: method choice, file selection, budget math,
mincore vectors; plus one real prefetch of a small tmp file (any Linux)."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from governor.errors import PermissionDenied, PolicyError, PolicyNotFound
from governor.launch import prefetch as pf

MIB = 1 << 20


@pytest.mark.parametrize(
    ("release", "first"),
    [
        ("6.1.0-57-amd64", "madv_populate_read"),
        ("5.14.0", "madv_populate_read"),
        ("5.10.160-rockchip", "map_populate"),
        ("garbage", "map_populate"),
    ],
)
def test_populate_method_is_chosen_by_kernel_version(release: str, first: str) -> None:
    methods = pf.populate_candidates(pf.kernel_version(release))
    assert methods[0] == first
    assert methods[-1] == "read"  # the read loop works on every file system


def test_mincore_vector_counts_only_the_low_bit() -> None:
    vec = bytes([1, 0, 3, 2, 1, 0])  # bits above bit 0 are reserved
    assert pf.resident_pages(vec) == 3
    assert pf.resident_fraction(vec) == pytest.approx(0.5)
    assert pf.resident_fraction(b"") == 1.0


def test_missing_ranges_are_byte_ranges_of_absent_pages() -> None:
    vec = bytes([0, 0, 1, 1, 0, 1, 0])
    assert pf.missing_ranges(vec, 4096) == [(0, 8192), (16384, 4096), (24576, 4096)]
    assert pf.missing_ranges(bytes([1, 1]), 4096) == []


def test_kv_cache_formula_matches_notes() -> None:
    # Qwen-1.8B-like: 24 layers, 2048 ctx, 2048 kv width, f16 -> 384 MiB (README's example)
    assert pf.kv_cache_bytes(24, 2048, 2048, 2) == 384 * MIB


def test_model_larger_than_memory_max_is_refused_with_the_numbers() -> None:
    with pytest.raises(PolicyError) as exc:
        pf.check_budget(
            model_bytes=600 * MIB,
            prefetch_bytes=600 * MIB,
            mode="populate",
            memory_max=512 * MIB,
            memory_high=None,
            source="p.toml",
        )
    assert exc.value.exit_code == 65
    assert str(600 * MIB) in str(exc.value) and str(512 * MIB) in str(exc.value)
    assert exc.value.field == "memory.max"


def test_kv_cache_counts_against_memory_max() -> None:
    with pytest.raises(PolicyError):
        pf.check_budget(
            model_bytes=400 * MIB,
            prefetch_bytes=400 * MIB,
            mode="none",
            memory_max=512 * MIB,
            memory_high=None,
            kv_bytes=200 * MIB,
        )


def test_prefetch_above_memory_high_is_a_warning() -> None:
    budget = pf.check_budget(
        model_bytes=600 * MIB,
        prefetch_bytes=600 * MIB,
        mode="populate",
        memory_max=1024 * MIB,
        memory_high=512 * MIB,
    )
    assert len(budget.warnings) == 1 and "memory.high" in budget.warnings[0]
    assert budget.notes  # the KV cache was not known: said so


def test_fitting_model_passes_quietly() -> None:
    budget = pf.check_budget(
        model_bytes=100 * MIB,
        prefetch_bytes=100 * MIB,
        mode="lock",
        memory_max=None,
        memory_high=512 * MIB,
        kv_bytes=10 * MIB,
    )
    assert budget.warnings == () and budget.notes == ()


def test_locking_more_than_memory_max_is_refused() -> None:
    with pytest.raises(PolicyError) as exc:
        pf.check_budget(
            model_bytes=None,
            prefetch_bytes=300 * MIB,
            mode="lock",
            memory_max=200 * MIB,
            memory_high=None,
        )
    assert exc.value.field == "prefetch.mode"


def _make(path: Path, nbytes: int = 4096) -> Path:
    path.write_bytes(b"x" * nbytes)
    return path


def test_auto_takes_every_part_of_a_split_gguf(tmp_path: Path) -> None:
    for i in (1, 2, 3):
        _make(tmp_path / f"m-0000{i}-of-00003.gguf")
    got = pf.resolve_files(
        "auto", model="m-00001-of-00003.gguf", engine_kind="llama.cpp", cwd=tmp_path
    )
    assert [p.name for p in got] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def test_auto_needs_a_llama_cpp_model() -> None:
    with pytest.raises(PolicyError):
        pf.resolve_files("auto", model=None, engine_kind="llama.cpp", cwd=Path("/"))
    with pytest.raises(PolicyError):
        pf.resolve_files("auto", model="x.gguf", engine_kind="generic", cwd=Path("/"))


def test_globs_expand_sorted_and_relative_to_cwd(tmp_path: Path) -> None:
    _make(tmp_path / "b.bin")
    _make(tmp_path / "a.bin")
    _make(tmp_path / "c.txt")
    got = pf.resolve_files(
        ["*.bin", str(tmp_path / "c.txt")], model=None, engine_kind="generic", cwd=tmp_path
    )
    assert [p.name for p in got] == ["a.bin", "b.bin", "c.txt"]


def test_glob_without_match_and_missing_file_are_66(tmp_path: Path) -> None:
    with pytest.raises(PolicyNotFound) as exc:
        pf.resolve_files(["*.gguf"], model=None, engine_kind="generic", cwd=tmp_path)
    assert exc.value.exit_code == 66
    with pytest.raises(PolicyNotFound):
        pf.resolve_files(["nope.gguf"], model=None, engine_kind="generic", cwd=tmp_path)


def _unreadable_exit_code(directory: Path) -> int:
    """resolve_files on a mode-000 file; 77 when it raised PermissionDenied. Root reads any
    file, so as root the check runs in a child that dropped to nobody (65534)."""
    f = _make(directory / "secret.gguf")
    f.chmod(0)

    def attempt() -> int:
        try:
            pf.resolve_files([str(f)], model=None, engine_kind="generic", cwd=directory)
        except PermissionDenied as err:
            return err.exit_code
        return 0

    if os.geteuid() != 0:
        return attempt()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            code = attempt()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_unreadable_file_is_77() -> None:
    # a world-traversable directory: pytest's tmp_path is 0700 (nobody could not even stat)
    directory = Path(tempfile.mkdtemp(prefix="governor-test-"))
    try:
        directory.chmod(0o755)
        assert _unreadable_exit_code(directory) == 77
    finally:
        shutil.rmtree(directory)


def test_directory_is_not_a_prefetch_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError):
        pf.resolve_files([str(tmp_path)], model=None, engine_kind="generic", cwd=tmp_path)


def test_progress_line_shows_bytes_rate_and_percent() -> None:
    line = pf.progress_line(512 * MIB, 1024 * MIB, 2.0, width=10)
    assert line == "prefetch [#####.....] 512MiB/1GiB 256MiB/s 50.0%"


def test_progress_bar_only_for_big_files_on_a_tty() -> None:
    out = io.StringIO()
    t = iter([0.0, 2.0, 4.0, 4.0])
    big = pf.Progress(pf.PROGRESS_MIN_BYTES, tty=out, clock=lambda: next(t))
    big.add(pf.PROGRESS_MIN_BYTES // 2)
    big.finish(1.0)
    assert "50.0%" in out.getvalue() and "resident 100.0%" in out.getvalue()
    small_out = io.StringIO()
    small = pf.Progress(MIB, tty=small_out, clock=lambda: 0.0)
    small.add(MIB)
    small.finish(1.0)
    assert small_out.getvalue() == ""


@pytest.mark.parametrize("mode", ["advise", "populate"])
def test_prefetch_of_a_real_file_reports_residency(tmp_path: Path, mode: pf.Mode) -> None:
    f = _make(tmp_path / "model.bin", 3 * MIB + 123)
    res = pf.Prefetcher().run([f], mode, tty=None)
    assert res.bytes == 3 * MIB + 123
    if mode == "advise":
        assert res.method == "fadvise_willneed"
    else:
        assert res.method in pf.populate_candidates(pf.kernel_version(os.uname().release))
    if mode == "populate":
        assert res.resident_fraction == 1.0


def test_result_travels_through_the_shared_mapping(tmp_path: Path) -> None:
    f = _make(tmp_path / "model.bin", 2 * MIB)
    job = pf.PrefetchJob(files=(str(f),), mode="populate")
    assert job.collect() is None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child publishes, as the engine's child does
        try:
            job.run()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    res = job.collect()
    assert res is not None and res.bytes == 2 * MIB and res.resident_fraction == 1.0
