"""[prefetch] against a real kernel (kernel tier, in the guest): the model's page cache is charged
to the slice, locked while the engine runs, protected by memory.min against a flood from another
cgroup, and a model larger than memory.max is refused before anything is applied.

The guest's /tmp is a tmpfs overlay (RAM, not page cache) and its 9p mounts bypass the page cache
for read(), so the files live on an ext4 loop device whose image is a sparse file on a writable
disk-backed mount (the harness's shared results directory in the guest): real page cache,
evictable, re-readable, and POSIX_FADV_DONTNEED makes it cold (tests/helpers/cold.py: the model's
pages only, not the governor's imports a whole-guest drop_caches would make it re-read).

Scale: a 32 MiB model by default (2x the governor's own page cache, the bound the populate test
tells apart; the loop image sits on the 9p share, so every MiB prefetched is read through it
under TCG), the seed's 512 MiB with scripts/test --full (GOVERNOR_TEST_FULL=1 in the guest). memory.min's protection is shown against the kernel's own reclaim from the root
(memory.reclaim of the root cgroup: the same protection walk as global reclaim,
mm/vmscan.c shrink_node_memcgs, ~1 s); the seed's page-cache flood from a sibling cgroup
(2 x 4 x 1.5 GiB of reads, ~8 min under TCG) is its `full` variant.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice
from helpers.cold import cold
from helpers.cold import resident as cached_fraction
from helpers.disk import loop_mount, make_file

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
FULL = os.environ.get("GOVERNOR_TEST_FULL") == "1"
# the compat tiers (scripts/test: Debian's 5.10 and 6.12) prove the same path with less I/O
COMPAT = os.environ.get("GOVERNOR_TEST_COMPAT") is not None
# 32 MiB (2x the governor's own page cache bound below) in the kernel tier too since issue 47
# item 3: the compat tiers had proved the same tests at that size; 64 only cost I/O
MODEL_MIB = 512 if FULL else 32  # guest RAM is 2 GiB
# the page cache charged to the governor's own cgroup is its imports (10.6 MiB on 5.10, 13.5 MiB
# on 6.12, measured): below this bound, and the model (MODEL_MIB more) would cross it
GOVERNOR_FILE_MIB = 16
assert MODEL_MIB > GOVERNOR_FILE_MIB
PROTECT_MIB = MODEL_MIB + 32 if not FULL else 600  # the protected run's memory.min
# model + flood exceed guest RAM, and the flood is read FLOOD_PASSES times: a one-pass flood
# never evicts the model, whose pages the populate mapping left on the active list
# (zap_pte_range marks young pages accessed; measured: 99% resident after a 3 GiB one-pass flood
# and 96% after 3 passes of 1.75 GiB, which streams past the LRU too; 42% after 3 x 1.5 GiB,
# which fits well enough to be re-used and activated)
FLOOD_MIB = 1536
FLOOD_PASSES = 4


@pytest.fixture(scope="module")
def disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An ext4 loop mount with model.bin (MODEL_MIB of data) and flood.bin (1.5 GiB sparse)."""
    with loop_mount(tmp_path_factory.mktemp("disk"), 5 << 10) as mnt:
        make_file(mnt / "model.bin", MODEL_MIB)
        with open(mnt / "flood.bin", "wb") as f:
            f.truncate(FLOOD_MIB * MIB)  # holes read as fresh zeroed page-cache pages
        yield mnt


def _kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int(minor)


def _locked_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _policy(tmp_path: Path, slice_: ScratchSlice, body: str, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nslice = "{slice_.name}"\n' + textwrap.dedent(body))
    return path


def _governor(*args: str) -> list[str]:
    return [sys.executable, "-m", "governor", *args]


def _stat(cgroup: Path) -> dict[str, int]:
    return cgroups.read_kv(cgroup / "memory.stat")


def _governor_procs(cgroup: Path) -> list[int]:
    """Processes in ``cgroup`` that are the governor's (the prefetch helper is a fork of it)."""
    out = []
    for pid in (cgroup / "cgroup.procs").read_text().split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"governor" in cmdline:
            out.append(int(pid))
    return out


def _prefetched(group: Path, size: int) -> bool:
    """The group holds >= 95% of the model in its page cache and no governor process is left in
    its leaf (the helper exited). False while the governor has not created the group yet."""
    try:
        return _stat(group)["file"] >= 0.95 * size and not _governor_procs(group / "engine")
    except FileNotFoundError:
        return False


def _waiting_engine(stop: Path) -> list[str]:
    return ["/bin/sh", "-c", f"while [ ! -e {stop} ]; do sleep 0.2; done"]


@pytest.mark.compat
@pytest.mark.kernel(controllers=("memory",), root=True, psi=False)
def test_populate_charges_the_slice_and_not_the_governor(
    tmp_path: Path,
    scratch_slice: ScratchSlice,
    enabled_root_subtree: Path,
    spawn: cgroups.Spawn,
    disk: Path,
) -> None:
    model = disk / "model.bin"
    size = model.stat().st_size
    policy = _policy(
        tmp_path,
        scratch_slice,
        f"""
        [memory]
        max = "1500M"
        [prefetch]
        files = ["{model}"]
        mode = "populate"
        """,
        "pop",
    )
    scratch_slice.create()
    cgroups.set_subtree_control(scratch_slice.path, ["memory"], True)
    gov_cg = scratch_slice.child("governor")
    report = tmp_path / "report.json"
    stop = tmp_path / "stop"
    cold(model)  # the model's pages only: the governor's imports stay cached (helpers/cold.py)
    gov = spawn(
        _governor(
            "launch",
            "--policy",
            str(policy),
            "--keep",
            "--report",
            str(report),
            "--",
            *_waiting_engine(stop),
        ),
        cgroup=gov_cg,
        cwd=REPO,
    )
    try:
        # the engine runs at once; the helper reads the model beside it, charged to the slice,
        # and exits once it verified residency (it is killed if the engine exits first)
        cgroups.wait_for(
            lambda: _prefetched(scratch_slice.path / "pop", size),
            timeout=300,
            what="the prefetch helper to bring the model in and exit",
        )
    except AssertionError as err:  # what the governor and the slice say (a CI run hung here once)
        stop.touch()
        group = scratch_slice.path / "pop"
        seen = {
            "slice file": _stat(group).get("file") if group.exists() else "no group",
            "governor pids in the leaf": _governor_procs(group / "engine")
            if (group / "engine").exists() else "no leaf",
        }  # fmt: skip
        try:
            out, _ = gov.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            gov.kill()
            out, _ = gov.communicate()
        raise AssertionError(
            f"{err}; model {size} B; {seen}; governor exit {gov.returncode}: {out[-3000:]}"
        ) from err
    finally:
        stop.touch()
    out, _ = gov.communicate(timeout=600)
    assert gov.returncode == 0, out
    charged = _stat(scratch_slice.path / "pop")["file"]
    governor_file = _stat(gov_cg)["file"]
    data = json.loads(report.read_text())
    print(f"slice file={charged} governor file={governor_file} size={size} report={data}")
    assert charged >= 0.95 * size
    assert governor_file < GOVERNOR_FILE_MIB * MIB, (
        "the governor's cgroup was charged for the model"
    )
    assert data["prefetch_bytes"] == size
    # MADV_POPULATE_READ is 5.14+: before it (a board's 5.10) a MAP_POPULATE mapping
    want = "madv_populate_read" if _kernel() >= (5, 14) else "map_populate"
    assert data["prefetch_method"] == want
    assert data["resident_fraction"] >= 0.95
    assert cached_fraction(model) >= 0.95


@pytest.mark.kernel(controllers=("memory",), root=True, psi=False)
def test_lock_mode_keeps_the_model_unevictable_while_the_engine_runs(
    tmp_path: Path, scratch_slice: ScratchSlice, disk: Path
) -> None:
    model = disk / "model.bin"
    size = model.stat().st_size
    policy = _policy(
        tmp_path,
        scratch_slice,
        f"""
        [memory]
        max = "1500M"
        [prefetch]
        files = ["{model}"]
        mode = "lock"
        """,
        "lck",
    )
    stop = tmp_path / "stop"
    report = tmp_path / "report.json"
    cold(model)
    gov = subprocess.Popen(
        _governor("launch", "--policy", str(policy), "--keep", "--report", str(report), "--",
                  *_waiting_engine(stop)),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    group = scratch_slice.path / "lck"
    try:
        seen = [0]

        def unevictable() -> int | None:
            try:
                u = _stat(group).get("unevictable", 0)
            except FileNotFoundError:  # not created yet
                u = 0
            seen[0] = u
            # mlocked pages reach the unevictable LRU through per-CPU batches (mm/mlock.c), so a
            # few pages per CPU may wait for the next drain while the locker sleeps: 99% here,
            # the exact mlock is checked below through the locker's VmLck
            return u if u >= 0.99 * size else None

        try:
            locked = cgroups.wait_for(
                unevictable, timeout=300, what="the model's pages to be unevictable in the slice"
            )
        except AssertionError as err:
            lck = {p: _locked_kib(p) for p in cgroups.pids(group / "engine")}
            raise AssertionError(
                f"{err}: unevictable {seen[0]} of {size}, VmLck KiB {lck}"
            ) from err
        print(f"unevictable while running: {locked} (file {size})")
        lockers = [p for p in cgroups.pids(group / "engine") if _locked_kib(p) * 1024 >= size]
        assert len(lockers) == 1, "no process in the leaf holds the lock"
    finally:
        stop.write_text("x")
        out, _ = gov.communicate(timeout=300)
    assert gov.returncode == 0, out
    cgroups.wait_for(
        lambda: _stat(group).get("unevictable", 0) < size // 20,
        timeout=120,
        what="the lock to be released after the engine exited",
    )
    assert not cgroups.populated(group), "the locker outlived the engine"
    data = json.loads(report.read_text())
    assert data["extra"]["prefetch_locked_bytes"] == size


def _protected_run(
    tmp_path: Path,
    scratch_slice: ScratchSlice,
    disk: Path,
    pressure: Callable[[str], None],
    *,
    protect: bool,
) -> float:
    """Launch the model (populate) with or without memory.min, put memory pressure on it from
    outside the slice while the engine runs (pressure(name)); return the model's residency."""
    model = disk / "model.bin"
    name = "prot" if protect else "ctrl"
    memory = f'[memory]\nmin = "{PROTECT_MIB}M"\n' if protect else '[memory]\nmax = "1500M"\n'
    policy = _policy(
        tmp_path,
        scratch_slice,
        memory + f'[prefetch]\nfiles = ["{model}"]\nmode = "populate"\n',
        name,
    )
    stop = tmp_path / f"stop-{name}"
    # a child's effective memory.min is capped by its parent's (mem_cgroup_calculate_protection,
    # mm/memcontrol.c): the governor raises the slice to the sum of its children's memory.min
    # itself (measured before it did: the group's memory.min alone left 40% resident)
    assert cgroups.read(scratch_slice.path / "memory.min") == "0"
    cold(model)
    gov = subprocess.Popen(
        _governor("launch", "--policy", str(policy), "--", *_waiting_engine(stop)),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        group = scratch_slice.path / name
        size = model.stat().st_size
        cgroups.wait_for(
            lambda: group.exists() and _stat(group)["file"] >= 0.95 * size,
            timeout=300,
            what="the model to be prefetched",
        )
        pressure(name)
        # the slice granted exactly the group's protection (page-floored) during the run
        slice_min = int(cgroups.read(scratch_slice.path / "memory.min"))
        assert slice_min == (PROTECT_MIB * MIB if protect else 0), slice_min
        resident = cached_fraction(model)
        print(f"{name}: resident after the pressure {resident:.3f}; group {_stat(group)['file']}")
    finally:
        stop.write_text("x")
        gov.communicate(timeout=300)
    # the slice stays (the test made it) and is lowered back to what remains: 0
    assert cgroups.read(scratch_slice.path / "memory.min") == "0"
    return resident


@pytest.mark.kernel(controllers=("memory",), root=True, psi=False)
def test_memory_min_keeps_the_model_resident_through_the_kernels_reclaim(
    tmp_path: Path, scratch_slice: ScratchSlice, enabled_root_subtree: Path, disk: Path
) -> None:
    """The root's memory.reclaim asks the kernel to reclaim as much as the guest has: it
    walks every cgroup as global reclaim does and skips what memory.min protects."""
    scratch_slice.create()
    cgroups.set_subtree_control(scratch_slice.path, ["memory"], True)

    def reclaim_everything(name: str) -> None:
        before = _meminfo("Cached")
        # EAGAIN: reclaimed less than asked (cgroup-v2.rst), as it must with the model protected
        with contextlib.suppress(BlockingIOError):
            cgroups.write(enabled_root_subtree / "memory.reclaim", _meminfo("MemTotal"))
        print(f"{name}: page cache {before >> 20} -> {_meminfo('Cached') >> 20} MiB")

    protected = _protected_run(tmp_path, scratch_slice, disk, reclaim_everything, protect=True)
    control = _protected_run(tmp_path, scratch_slice, disk, reclaim_everything, protect=False)
    assert protected >= 0.95, f"memory.min did not protect the model ({protected:.3f})"
    assert control < 0.5, f"the control run kept the model ({control:.3f}): no real reclaim"


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/meminfo")


@pytest.mark.full
@pytest.mark.kernel(controllers=("memory",), root=True, psi=False)
def test_memory_min_keeps_the_model_resident_through_a_page_cache_flood(
    tmp_path: Path,
    scratch_slice: ScratchSlice,
    enabled_root_subtree: Path,
    spawn: cgroups.Spawn,
    disk: Path,
) -> None:
    """The seed's scale: a sibling cgroup reads FLOOD_PASSES x 1.5 GiB through the page cache
    (more than the guest's RAM) while the model is protected, then again while it is not."""
    scratch_slice.create()
    cgroups.set_subtree_control(scratch_slice.path, ["memory"], True)

    def flood(name: str) -> None:
        proc = spawn(
            [sys.executable, str(HELPERS / "pagecache.py"), str(disk / "flood.bin"),
             "--repeat", str(FLOOD_PASSES)],
            cgroup=scratch_slice.child(f"flood-{name}"),
        )  # fmt: skip
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out

    protected = _protected_run(tmp_path, scratch_slice, disk, flood, protect=True)
    control = _protected_run(tmp_path, scratch_slice, disk, flood, protect=False)
    assert protected >= 0.95, f"memory.min did not protect the model ({protected:.3f})"
    # without memory.min the flood takes a large share of the model (measured 42% left)
    assert control < 0.8, f"the control run kept the model ({control:.3f}): no real pressure"


@pytest.mark.kernel(controllers=("memory",), root=True, psi=False)
def test_model_larger_than_memory_max_is_refused_before_anything_is_applied(
    tmp_path: Path, scratch_slice: ScratchSlice, disk: Path
) -> None:
    model = disk / "model.bin"
    policy = _policy(
        tmp_path,
        scratch_slice,
        f"""
        [memory]
        max = "{MODEL_MIB // 2}M"
        [engine]
        kind = "llama.cpp"
        [prefetch]
        mode = "populate"
        """,
        "big",
    )
    res = subprocess.run(
        _governor("launch", "--policy", str(policy), "--", "/bin/true", "-m", str(model), "-c", "512"),
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert res.returncode == 65, res.stderr
    assert "does not fit memory.max" in res.stderr and "Traceback" not in res.stderr
    assert not scratch_slice.path.exists(), "a cgroup was created for a refused launch"
