"""Pure parts of governor/launch/prefetch.py: method choice, mincore vectors, progress; plus
one real prefetch of a small tmp file (any Linux). File selection and the budget are the
preflight's (tests/unit/engines/test_preflight.py)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from governor.launch import prefetch as pf
from governor.launch.helper import PrefetchHelper

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


def _make(path: Path, nbytes: int = 4096) -> Path:
    path.write_bytes(b"x" * nbytes)
    return path


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
    else:  # just written: resident already, unless the page cache let it go meanwhile
        methods = pf.populate_candidates(pf.kernel_version(os.uname().release))
        assert res.method in (*methods, "resident")
    if mode == "populate":
        assert res.resident_fraction == 1.0


def test_the_helper_prefetches_beside_the_engine_and_reports_through_the_shared_mapping(
    tmp_path: Path,
) -> None:
    """The helper is a child of the governor that outlives nothing: its result comes back
    through the shared mapping, and finish() reaps it."""
    f = _make(tmp_path / "model.bin", 2 * MIB)
    engine = subprocess.Popen(["sleep", "30"])
    try:
        helper = PrefetchHelper(files=(str(f),), mode="populate")
        assert helper.result() == (None, None)
        helper.start(
            engine.pid, spawn=lambda: (os.fork(), True), join=lambda: None, kill_group=lambda: None
        )
        pid = helper.pid
        assert pid is not None
        # the helper is reaped when it exits, while the engine still runs: no zombie stays
        # for the engine's life (a llama-server runs for days)
        assert _gone(pid), f"prefetch helper {pid} still there: {_state(pid)}"
        assert helper.reaped and engine.poll() is None
        res, lock_errno = helper.finish()
    finally:
        engine.kill()
        engine.wait()
    assert lock_errno is None
    assert res is not None and res.bytes == 2 * MIB and res.resident_fraction == 1.0


def _state(pid: int) -> str:
    """The process's state letter (Z: a zombie), "gone" when /proc has no such pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _gone(pid: int, limit_s: float = 30.0) -> bool:
    """Whether ``pid`` disappears (exited AND reaped) within ``limit_s``: a bound for a slow
    machine, not a timing assertion."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if _state(pid) == "gone":
            return True
        time.sleep(0.02)
    return False


def test_finish_stops_a_helper_still_reading_and_reaps_it(tmp_path: Path) -> None:
    """The engine exited while the helper still works: finish() kills it through its pidfd and
    reaps it (the reaper thread), nothing left behind."""
    f = _make(tmp_path / "model.bin", 1 * MIB)
    engine = subprocess.Popen(["sleep", "30"])

    def spawn() -> tuple[int, bool]:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - a helper that never finishes
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
            while True:
                time.sleep(1)
        return pid, True

    helper = PrefetchHelper(files=(str(f),), mode="populate")
    try:
        helper.start(engine.pid, spawn=spawn, join=lambda: None, kill_group=lambda: None)
        pid = helper.pid
        assert pid is not None and not helper.reaped
        assert helper.finish() == (None, None)
        assert helper.pid is None and helper.reaped
        assert _state(pid) == "gone"
    finally:
        if helper.pid is not None:  # the check failed: leave no forked pytest behind
            with contextlib.suppress(OSError):
                os.kill(helper.pid, signal.SIGKILL)
        engine.kill()
        engine.wait()


def test_a_resident_file_is_not_filled_again_and_a_cold_one_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm start: populate finds every page resident (mincore) and fills nothing (the
    method says "resident"); pages dropped from the page cache are filled."""
    f = _make(tmp_path / "model.bin", 2 * MIB)
    f.read_bytes()  # resident
    filled: list[tuple[str, int, int]] = []
    real = pf.Prefetcher._fill

    def spy(self: pf.Prefetcher, method: pf.Method, fd: int, off: int, n: int) -> None:
        filled.append((method, off, n))
        real(self, method, fd, off, n)

    monkeypatch.setattr(pf.Prefetcher, "_fill", spy)
    warm = pf.Prefetcher().run([f], "populate", tty=None)
    assert (warm.method, warm.resident_fraction, filled) == ("resident", 1.0, [])
    # the same file seen cold: the first mincore() says no page is resident
    real_residency = pf.Prefetcher.residency
    calls: list[int] = []

    def cold_first(self: pf.Prefetcher, fd: int, size: int) -> bytes:
        calls.append(size)
        vec = real_residency(self, fd, size)
        return bytes(len(vec)) if len(calls) == 1 else vec

    monkeypatch.setattr(pf.Prefetcher, "residency", cold_first)
    cold = pf.Prefetcher().run([f], "populate", tty=None)
    assert cold.method in pf.populate_candidates(pf.kernel_version(os.uname().release))
    assert sum(n for _, _, n in filled) == 2 * MIB and cold.resident_fraction == 1.0
