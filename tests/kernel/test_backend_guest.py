"""CgroupfsBackend against a real cgroup v2 kernel (runs in the qemu guest, as root).

Each test starts from an EMPTY root cgroup.subtree_control (fixture empty_root_subtree), so the
backend must enable every controller itself, and works in its own ``gtest-<hex>.slice``
(fixture scratch_slice) that the backend creates. These write under the real cgroup2 root, so
besides the ``kernel`` marker they run only in the kernel tier of the guest harness
(GOVERNOR_TEST_TIER=kernel, set by tests/vm/harness.py), never on a developer's machine.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from pathlib import Path

import pytest
from helpers.cgroups import ScratchSlice, Spawn

from governor.backends.cgroupfs import CgroupfsBackend
from governor.errors import BackendError, HostError
from governor.kernel import files
from governor.kernel.cgroupfs import CgroupFs
from governor.plan.model import (
    CgroupWrite,
    EnableControllers,
    EngineSpec,
    LaunchSpec,
    Plan,
    PrefetchSpec,
)

CONTROLLERS = ("pids", "memory", "io", "cpu", "cpuset")
MIB = 1 << 20

pytestmark = [
    pytest.mark.kernel(controllers=("memory", "cpu", "cpuset", "io", "pids"), root=True),
    pytest.mark.skipif(
        os.environ.get("GOVERNOR_TEST_TIER") != "kernel",
        reason="writes the real cgroup2 root: runs only in the kernel-tier guest",
    ),
]


def _page_aligned(n: int) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    return n // page * page


def _plan(slice_: str, root: Path, *, cpus: str = "1-2") -> Plan:
    group = f"{slice_}/policy"

    def w(file: str, value: str) -> CgroupWrite:
        return CgroupWrite(
            cgroup=group, file=file, value=value, reason=file, controller=files.controller_of(file)
        )

    return Plan(
        policy="guest-policy",
        cgroup_root=str(root),
        slice=slice_,
        group=group,
        leaf=f"{group}/engine",
        create=(slice_, group, f"{group}/engine"),
        enable=tuple(
            EnableControllers(cgroup=cg, controllers=CONTROLLERS) for cg in ("", slice_, group)
        ),
        writes=(
            w(files.PIDS_MAX, "64"),
            w(files.MEMORY_MIN, str(_page_aligned(16 * MIB))),
            w(files.MEMORY_HIGH, str(_page_aligned(96 * MIB))),
            w(files.MEMORY_MAX, str(_page_aligned(128 * MIB))),
            w(files.MEMORY_SWAP_MAX, "0"),
            w(files.MEMORY_OOM_GROUP, "1"),
            w(files.IO_WEIGHT, "default 200"),
            w(files.CPU_WEIGHT, "200"),
            w(files.CPU_MAX, "200000 100000"),
            w(files.CPUSET_CPUS, cpus),
        ),
        controllers=CONTROLLERS,
        launch=LaunchSpec(),
        engine=EngineSpec(),
        prefetch=PrefetchSpec(),
        watch=(),
    )


@pytest.fixture
def fs(empty_root_subtree: Path) -> CgroupFs:
    """The guest's cgroup2 root with an empty root subtree_control (restored afterwards)."""
    return CgroupFs(empty_root_subtree)


@pytest.fixture
def slice_name(scratch_slice: ScratchSlice) -> str:
    """A unique slice the backend itself creates; killed and removed at teardown."""
    return scratch_slice.name


def _subtree_control_file(fs: CgroupFs) -> str:
    return fs.read("", files.CGROUP_SUBTREE_CONTROL).strip()


def test_apply_from_an_empty_root_enables_controllers_and_every_file_reads_back(
    fs: CgroupFs, slice_name: str
) -> None:
    plan = _plan(slice_name, fs.root)
    backend = CgroupfsBackend(fs)

    applied = backend.apply(plan)

    assert applied.created == plan.create
    assert set(CONTROLLERS) <= fs.subtree_control("")  # enabled by the backend itself
    assert set(CONTROLLERS) <= fs.subtree_control(plan.group)
    live = {o.write.file: o.live for o in backend.observe(plan)}
    assert live[files.MEMORY_HIGH] == str(_page_aligned(96 * MIB))
    assert live[files.CPUSET_CPUS] == "1-2"
    assert live[files.CPU_WEIGHT] == "200"
    assert live[files.CPU_MAX] == "200000 100000"
    assert live[files.PIDS_MAX] == "64"
    mismatched = [o for o in backend.observe(plan) if not o.matches]
    assert mismatched == []


def test_an_invalid_cpuset_write_raises_with_coordinates_and_rolls_back(
    fs: CgroupFs, slice_name: str
) -> None:
    plan = _plan(slice_name, fs.root, cpus="99")
    backend = CgroupfsBackend(fs)

    with pytest.raises(BackendError) as exc:
        backend.apply(plan)

    err = exc.value
    assert (err.cgroup, err.file, err.value) == (plan.group, files.CPUSET_CPUS, "99")
    # EINVAL when 99 < nr_cpu_ids but not in the parent's CPUs; ERANGE from cpulist_parse()
    # when 99 >= nr_cpu_ids (the usual case in a 4-CPU guest)
    assert err.errno in (errno.EINVAL, errno.ERANGE)
    assert not fs.exists(slice_name)
    assert _subtree_control_file(fs) == ""  # the controllers the backend added are gone


def test_remove_kills_a_sleeping_process_in_the_leaf_and_removes_everything(
    fs: CgroupFs, slice_name: str, spawn: Spawn
) -> None:
    plan = _plan(slice_name, fs.root)
    backend = CgroupfsBackend(fs)
    backend.apply(plan)
    sleeper = spawn(["sleep", "1000"], cgroup=fs.path(plan.leaf), stdout=None, stderr=None)
    assert fs.procs(plan.leaf) == [sleeper.pid]
    reaper = threading.Thread(target=sleeper.wait, daemon=True)  # no zombie left behind
    reaper.start()

    removed = backend.remove(plan)

    assert removed.killed is True
    assert removed.removed == (plan.leaf, plan.group, slice_name)
    reaper.join(timeout=10)
    assert sleeper.returncode == -signal.SIGKILL
    assert not fs.exists(slice_name)
    assert backend.remove(plan).removed == ()  # idempotent


def test_a_second_flock_on_the_same_group_fails_and_the_first_release_frees_it(
    fs: CgroupFs, slice_name: str
) -> None:
    """flock(2) on a cgroupfs directory fd: the generic VFS lock, checked on kernfs here."""
    plan = _plan(slice_name, fs.root)
    first = CgroupfsBackend(fs)
    second = CgroupfsBackend(CgroupFs(fs.root))

    with first.lock(plan):
        assert fs.exists(plan.group)
        with pytest.raises(HostError) as exc, second.lock(plan):
            pass
        assert exc.value.exit_code == 69
        assert plan.group in str(exc.value)
    with second.lock(plan):
        pass
    assert not fs.exists(slice_name)  # the lock removed the empty dirs it created
