"""The board's swap and thrash on a real kernel (issue 33; kernel tier, in the guest).

- zram: a zram swap device (modprobe zram, disksize through sysfs, mkswap, swapon); a
  background job throttled by its memory.high with swap allowed: its anon pages go to zram,
  the device's mm_stat grows, and `governor status` shows zram's pool as board memory charged
  to no slice, and what the slice's swap_max costs the board there.
- zswap (enabled at run time through /sys/module/zswap/parameters/enabled, the same switch as
  zswap.enabled=1 on the command line, restored afterwards): zswap_max written and read back;
  zswap_writeback written and read back where the kernel has it (6.8+), else refused with the
  kernel's version and applied without it under --allow-missing zswap.
- thrash: an engine whose "model" (a file on an ext4 loop mount) is re-read while memory.high
  squeezes its page cache: the refault rule fires, and a PSI rule with the same window fires
  later or not at all; both times are printed for the issue's note.

Nothing is timed: waits are for kernel files and log lines with generous bounds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import PAGECACHE, argv, cgroups
from helpers.cgroups import ScratchSlice
from helpers.disk import loop_mount, make_file

REPO = Path(__file__).resolve().parents[2]
NEEDS = {"controllers": ("memory",), "root": True, "psi": True}
MIB = 1 << 20
# anon pages a quarter random, three quarters zero: compressible like real heaps (~3-4:1 with
# lzo), and never a same-filled page (zram stores those without memory)
ANON_JOB = """
import mmap, os, sys, time
mib = int(sys.argv[1]); page = mmap.PAGESIZE
m = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # anon, not shmem
for off in range(0, mib << 20, page):
    m[off:off + page // 4] = os.urandom(page // 4)
print("anon ready", flush=True)
time.sleep(3600)
"""


def _sh(*args: str) -> str:
    res = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, f"{' '.join(args)}: {res.stderr.strip()}"
    return res.stdout


def _launch(
    run: Path, policy: Path, *engine: str, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[str], Path]:
    err = policy.with_suffix(".err")
    proc = subprocess.Popen(
        [sys.executable, "-m", "governor", "launch", "--policy", str(policy), *extra, "--",
         *engine],
        cwd=REPO, env={**os.environ, "GOVERNOR_RUN_DIR": str(run)},
        stdout=subprocess.DEVNULL, stderr=err.open("w"), text=True,
    )  # fmt: skip
    return proc, err


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _status(run: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "governor", "status", name, *args],
        capture_output=True, text=True, timeout=240, cwd=REPO, check=False,
        env={**os.environ, "GOVERNOR_RUN_DIR": str(run)},
    )  # fmt: skip


def _policy(tmp_path: Path, slice_: ScratchSlice, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nslice = "{slice_.name}"\n' + textwrap.dedent(body))
    return path


def _events(err: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in err.read_text().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("event") == name:
                out.append(rec)
    return out


@pytest.fixture
def zram_swap() -> Iterator[Path]:
    """A 256 MiB zram swap device, swapped on (priority 100); swapped off and reset after."""
    _sh("modprobe", "zram")
    dev = Path("/sys/block/zram0")
    if cgroups.read(dev / "disksize") != "0":  # in use: add one
        dev = Path("/sys/block") / f"zram{cgroups.read(Path('/sys/class/zram-control/hot_add'))}"
    cgroups.write(dev / "disksize", str(256 * MIB))
    node = f"/dev/{dev.name}"
    cgroups.wait_for(lambda: Path(node).exists() or None, 30, node)
    _sh("mkswap", node)
    _sh("swapon", "-p", "100", node)
    try:
        yield dev
    finally:
        subprocess.run(["swapoff", node], capture_output=True, timeout=300, check=False)
        cgroups.write(dev / "reset", "1")


def _at_least(path: Path, n: int) -> int | None:
    try:
        got = int(cgroups.read(path))
    except (OSError, ValueError):
        return None  # the group is not made yet
    return got if got >= n else None


def _mm_stat(dev: Path) -> list[int]:
    return [int(x) for x in cgroups.read(dev / "mm_stat").split()]


def _zram_stored(dev: Path) -> int:
    """The bytes of pages zram holds: orig_data_size + same_pages (mm_stat's 1st and 6th
    fields; a zero-filled page is kept as a same-filled marker, not in orig_data_size)."""
    stat = _mm_stat(dev)
    return stat[0] + stat[5] * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.kernel(**NEEDS)
def test_a_throttled_background_jobs_anon_pages_go_to_zram_and_status_counts_them(
    tmp_path: Path, scratch_slice: ScratchSlice, zram_swap: Path
) -> None:
    job = tmp_path / "anon_job.py"
    job.write_text(ANON_JOB)
    policy = _policy(
        tmp_path, scratch_slice, "bg",
        """
        [memory]
        high = "48M"
        max = "256M"
        swap_max = "128M"
        [qos]
        class = "background"
        """,
    )  # fmt: skip
    run = tmp_path / "run"
    proc, err = _launch(run, policy, sys.executable, str(job), "96")
    group = scratch_slice.path / "bg"
    try:
        # memory.high reclaims the job's anon pages: with swap allowed they go to zram
        swapped = cgroups.wait_for(
            lambda: _at_least(group / "memory.swap.current", 32 * MIB),
            240, "the job's pages in swap",
        )  # fmt: skip
        # and stored by zram: swap.current counts a slot from its allocation, zram's
        # orig_data_size once the page is written (a CI run read 33665024 B against 33030144 B
        # at the same moment), and zero-filled pages only as same_pages
        cgroups.wait_for(
            lambda: _zram_stored(zram_swap) >= 32 * MIB or None, 60, "the pages stored by zram"
        )
        orig, compr, used = _mm_stat(zram_swap)[:3]
        print(
            f"zram: slice swap.current {swapped} B; mm_stat orig_data_size {orig} B,"
            f" compr_data_size {compr} B, mem_used_total {used} B ({orig / max(used, 1):.1f}:1)"
        )
        assert _zram_stored(zram_swap) >= 32 * MIB and 0 < used < orig, (orig, compr, used)
        res = _status(run, "bg", "--json")
        assert res.returncode == 0, res.stderr
        (item,) = json.loads(res.stdout)
        sw = item["board_swap"]
        assert sw["kind"] == "zram" and f"/dev/{zram_swap.name}" in [
            d["name"] for d in sw["devices"]
        ]
        assert sw["zram_used"] > 0 and sw["zram_stored"] >= 32 * MIB, sw
        assert item["usage"]["memory"]["swap"] >= 32 * MIB
        assert int(cgroups.read_kv(group / "memory.stat")["anon"]) < 48 * MIB  # the rest swapped
        plain = _status(run, "bg").stdout
        assert "charged to no slice" in plain and "swap_max 128MiB on zram costs the board" in plain
        print("status:", *[ln for ln in plain.splitlines() if "swap" in ln], sep="\n  ")
        # governor board (and admission, which gathers the same claims) counts zram's pool
        res = subprocess.run(
            [sys.executable, "-m", "governor", "board", "--json"], capture_output=True,
            text=True, timeout=240, cwd=REPO, check=False,
            env={**os.environ, "GOVERNOR_RUN_DIR": str(run)},
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        board = json.loads(res.stdout)
        (zram,) = [c for c in board["slices"] if c["name"] == "[zram]"]
        now_used = _mm_stat(zram_swap)[2]
        assert zram["min"] > 0 and abs(zram["min"] - now_used) <= 4 * MIB, (zram, now_used)
        assert board["claimed"]["min"] >= zram["min"]
        print(f"board: [zram] claims {zram['min']} B; claimed min {board['claimed']['min']} B")
    finally:
        _stop(proc)
    assert proc.returncode in (0, 143), err.read_text()[-2000:]


@pytest.fixture
def zswap_on() -> Iterator[None]:
    path = Path("/sys/module/zswap/parameters/enabled")
    before = cgroups.read(path)
    cgroups.write(path, "Y")
    try:
        yield
    finally:
        cgroups.write(path, before)


def _kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int(minor)


@pytest.mark.compat  # 5.10: both refused; 6.1: writeback refused; 6.12: both read back
@pytest.mark.kernel(**NEEDS)
def test_zswap_max_and_writeback_are_written_and_read_back_or_refused_by_version(
    tmp_path: Path, scratch_slice: ScratchSlice, zswap_on: None
) -> None:
    policy = _policy(
        tmp_path, scratch_slice, "zs",
        """
        [memory]
        max = "256M"
        zswap_max = "16M"
        zswap_writeback = false
        """,
    )  # fmt: skip
    run = tmp_path / "run"
    group = scratch_slice.path / "zs"
    has_max, has_writeback = _kernel() >= (5, 19), _kernel() >= (6, 8)
    have = ".".join(map(str, _kernel()))
    degraded = [] if has_max else [f"memory.zswap.max = {16 * MIB} (kernel {have} < 5.19)"]
    extra: tuple[str, ...] = ()
    if not has_writeback:
        degraded.append(f"memory.zswap.writeback = 0 (kernel {have} < 6.8)")
        check = subprocess.run(
            [sys.executable, "-m", "governor", "check", str(policy)],
            capture_output=True, text=True, timeout=240, cwd=REPO, check=False,
        )  # fmt: skip
        assert check.returncode == 69, check.stderr
        assert "memory.zswap.writeback needs kernel >= 6.8" in check.stderr
        assert ("memory.zswap.max needs kernel >= 5.19" in check.stderr) is not has_max
        assert os.uname().release in check.stderr
        extra = ("--allow-missing", "zswap")
    proc, err = _launch(run, policy, "sleep", "600", extra=extra)
    print(f"zswap: kernel {os.uname().release}, max file: {has_max}, writeback: {has_writeback}")
    try:
        cgroups.wait_for((run / "zs" / "state.json").exists, 240, "the published state")
        if has_max:
            assert cgroups.read(group / "memory.zswap.max") == str(16 * MIB)
        if has_writeback:
            assert cgroups.read(group / "memory.zswap.writeback") == "0"
        res = _status(run, "zs", "--json")
        (item,) = json.loads(res.stdout)
        assert item["board_swap"]["zswap_enabled"] is True
        knobs = {k["file"]: k["state"] for k in item["knobs"]}
        if has_max:
            assert item["usage"]["memory"]["zswap"] == 0
            assert knobs["memory.zswap.max"] == "in sync"
        assert item["degraded"] == degraded
    finally:
        _stop(proc)
    assert proc.returncode in (0, 143), err.read_text()[-2000:]


@pytest.mark.kernel(**NEEDS)
def test_a_squeezed_model_re_read_fires_the_refault_rule_before_psi_with_the_same_window(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    with loop_mount(mnt, 160) as disk:
        model = make_file(disk / "model.gguf", 96)
        fd = os.open(model, os.O_RDONLY)  # the writer's cache is not the engine's: drop it
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        policy = _policy(
            tmp_path, scratch_slice, "chat",
            """
            [memory]
            high = "40M"
            max = "256M"
            swap_max = "0"
            [[pressure]]
            when = "refaults > 50%/4s"
            do = ["log"]
            [[pressure]]
            when = "memory some 300ms/4s"
            do = ["log"]
            """,
        )  # fmt: skip
        run = tmp_path / "run"
        proc, err = _launch(run, policy, *argv(PAGECACHE, str(model), "--repeat", "100000"))
        try:
            fired = cgroups.wait_for(
                lambda: [e for e in _events(err, "rule.fired") if e["rule"] == 0] or None,
                240, "the refault rule",
            )  # fmt: skip
            # one more window: does the PSI rule see it too? (printed; the order asserted below
            # is settled when the refault rule fires: a PSI firing before it is logged before)
            time.sleep(4)
            res = _status(run, "chat", "--json")
            (item,) = json.loads(res.stdout)
            rules = {r["rule"]: r for r in item["rules"]}
            stat = cgroups.read_kv(scratch_slice.path / "chat" / "memory.stat")
        finally:
            _stop(proc)
    refault_t = fired[0]["t_s"]
    psi = [e for e in _events(err, "rule.fired") if e["rule"] == 1]
    psi_t = psi[0]["t_s"] if psi else None
    print(
        f"thrash: refault rule fired at t={refault_t}s (share {fired[0]['value']}%),"
        f" PSI rule (memory some 300ms/4s) at t={psi_t}s;"
        f" workingset_refault_file {stat.get('workingset_refault_file')} pages,"
        f" file {stat.get('file')} B"
    )
    assert fired[0]["value"] > 50
    assert "refaults_pct" in rules[0]
    assert psi_t is None or psi_t >= refault_t, (refault_t, psi_t)
