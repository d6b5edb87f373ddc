"""memory.min/low of a group protect nothing unless every ancestor grants as much (a child's
protection is capped by its parent's, mm/memcontrol.c): apply raises the governor's slice to
the sum of its children's values, remove lowers it back, a failure restores it."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from governor.backends.cgroupfs import CgroupfsBackend
from governor.errors import BackendError
from governor.kernel import files
from governor.plan.model import CgroupWrite, Plan
from governor.record import replace

from .fakekernel import FakeKernelCgroupFs, FaultyFs, make_root
from .plans import SLICE, make_plan, snapshot

MIB = 1 << 20


def _plan(name: str, *, min_: int | None = None, low: int | None = None) -> Plan:
    group = f"{SLICE}/{name}"
    writes = []
    for file, value in ((files.MEMORY_MIN, min_), (files.MEMORY_LOW, low)):
        if value is not None:
            writes.append(
                CgroupWrite(
                    cgroup=group, file=file, value=str(value), reason=file, controller="memory"
                )
            )
    writes.append(
        CgroupWrite(cgroup=group, file=files.MEMORY_MAX, value=str(900 * MIB), reason="memory.max", controller="memory")
    )  # fmt: skip
    protect = tuple(w.file for w in writes if w.file in (files.MEMORY_MIN, files.MEMORY_LOW))
    plan = make_plan(
        writes=tuple(writes), controllers=("memory",), policy=name, group=group, leaf=f"{group}/engine"
    )  # fmt: skip
    return replace(plan, protect_parents=protect)


def _min(fs: FakeKernelCgroupFs, cgroup: str = SLICE, file: str = files.MEMORY_MIN) -> int:
    return int(fs.read(cgroup, file))


def test_apply_raises_the_slice_to_the_group_and_remove_drops_the_slice(
    fake_fs: FakeKernelCgroupFs,
) -> None:
    backend = CgroupfsBackend(fake_fs)
    plan = _plan("chat", min_=600 * MIB, low=100 * MIB)
    applied = backend.apply(plan)
    assert _min(fake_fs) == 600 * MIB
    assert _min(fake_fs, file=files.MEMORY_LOW) == 100 * MIB
    raised = [(r.cgroup, r.file, r.previous) for r in applied.writes if r.cgroup == SLICE]
    assert raised == [(SLICE, files.MEMORY_MIN, "0"), (SLICE, files.MEMORY_LOW, "0")]
    backend.remove(plan)
    assert not fake_fs.exists(SLICE)


def test_two_policies_in_one_slice_sum_and_removal_lowers_to_what_remains(
    fake_fs: FakeKernelCgroupFs,
) -> None:
    backend = CgroupfsBackend(fake_fs)
    chat, batch = _plan("chat", min_=600 * MIB), _plan("batch", min_=200 * MIB)
    backend.apply(chat)
    backend.apply(batch)
    assert _min(fake_fs) == 800 * MIB
    backend.remove(chat)
    assert _min(fake_fs) == 200 * MIB  # the slice is kept for batch and grants just that
    backend.remove(batch)
    assert not fake_fs.exists(SLICE)


def test_an_operators_larger_slice_value_is_kept_at_apply(fake_fs: FakeKernelCgroupFs) -> None:
    fake_fs.enable("", ["memory"])
    fake_fs.mkdir(SLICE)
    fake_fs.write(SLICE, files.MEMORY_MIN, str(1024 * MIB))
    applied = CgroupfsBackend(fake_fs).apply(_plan("chat", min_=600 * MIB))
    assert _min(fake_fs) == 1024 * MIB
    assert all(r.cgroup != SLICE for r in applied.writes)


def test_a_child_asking_for_max_makes_the_slice_max(fake_fs: FakeKernelCgroupFs) -> None:
    backend = CgroupfsBackend(fake_fs)
    plan = _plan("chat", min_=600 * MIB)
    backend.apply(plan)
    fake_fs.mkdir(f"{SLICE}/greedy")
    fake_fs.write(f"{SLICE}/greedy", files.MEMORY_MIN, "max")
    backend.apply(_plan("other", min_=MIB))
    assert fake_fs.read(SLICE, files.MEMORY_MIN).strip() == "max"


def test_no_protection_asked_leaves_the_slice_alone(fake_fs: FakeKernelCgroupFs) -> None:
    applied = CgroupfsBackend(fake_fs).apply(_plan("chat"))
    assert _min(fake_fs) == 0 and all(r.cgroup != SLICE for r in applied.writes)


def test_a_failed_slice_write_restores_the_whole_tree(tmp_path: Path) -> None:
    fs = FaultyFs(make_root(tmp_path / "cgroup"))
    before = snapshot(tmp_path / "cgroup")
    plan = _plan("chat", min_=600 * MIB)
    fs.op, fs.n, fs.code = "write", len(plan.writes), errno.EBUSY  # the slice's memory.min
    with pytest.raises(BackendError) as info:
        CgroupfsBackend(fs).apply(plan)
    assert info.value is fs.injected and info.value.file == files.MEMORY_MIN
    assert info.value.cgroup == SLICE
    assert snapshot(tmp_path / "cgroup") == before


class LockCheckingFs(FakeKernelCgroupFs):
    """Records, at every read and write of the slice's memory.min/low, whether some other open
    file description holds an exclusive flock on the slice's directory."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.seen: list[tuple[str, bool]] = []

    def _held(self, cgroup: str) -> bool:
        import fcntl
        import os

        fd = os.open(self.path(cgroup), os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def read(self, cgroup: str, file: str) -> str:
        if cgroup == SLICE and file in (files.MEMORY_MIN, files.MEMORY_LOW):
            self.seen.append((f"read {file}", self._held(cgroup)))
        return super().read(cgroup, file)

    def write(self, cgroup: str, file: str, value: str) -> None:
        if cgroup == SLICE and file in (files.MEMORY_MIN, files.MEMORY_LOW):
            self.seen.append((f"write {file}", self._held(cgroup)))
        super().write(cgroup, file, value)


def test_the_slices_sum_is_read_and_written_under_a_lock_on_the_slice(cgroup_root: Path) -> None:
    """Two launches in one slice: without the lock both read the old sum and the second write
    loses the first's share."""
    fs = LockCheckingFs(cgroup_root)
    backend = CgroupfsBackend(fs)
    plan = _plan("chat", min_=600 * MIB)
    backend.apply(plan)
    backend.remove(plan)
    rmw = [(what, held) for what, held in fs.seen if what.endswith(files.MEMORY_MIN)]
    assert ("write memory.min", True) in rmw
    assert all(held for _, held in rmw), rmw
