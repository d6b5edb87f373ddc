"""CgroupfsBackend on fake trees: apply/observe/remove, rollback after a failure at every step."""

from __future__ import annotations

import errno
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from governor.backends.cgroupfs import Applied, CgroupfsBackend
from governor.errors import BackendError, HostError, PermissionDenied
from governor.kernel import files
from governor.log import capture_logs
from governor.record import replace

from .fakekernel import FakeKernelCgroupFs, FaultyFs, make_root
from .plans import (
    GROUP,
    LEAF,
    MEMORY_HIGH,
    SLICE,
    WRITES,
    make_busy_tree,
    make_plan,
    make_stale_tree,
    snapshot,
)

SCENARIOS: dict[str, Callable[[FakeKernelCgroupFs], None]] = {
    "fresh": lambda fs: None,
    "busy": make_busy_tree,
    "stale": make_stale_tree,
}
# every mutating step of applying make_plan() to either scenario, in order: each parent's
# controllers go on before its child is made, so a new cgroup appears with its files
STEPS = [step for i in range(3) for step in (("enable", i), ("mkdir", i))]
STEPS += [("write", i) for i in range(len(WRITES))]


def _tree(
    tmp_path: Path, scenario: str, *, op: str | None = None, n: int = 0, code: int = errno.EINVAL
) -> FaultyFs:
    """A scenario tree whose fault is armed only after the scenario was built."""
    fs = FaultyFs(make_root(tmp_path / "cgroup"))
    SCENARIOS[scenario](fs)
    fs.calls.clear()
    fs.op, fs.n, fs.code = op, n, code
    return fs


# --- apply / observe ---------------------------------------------------------------------------


def test_apply_on_a_fresh_tree_enables_controllers_and_every_write_matches(
    fake_fs: FakeKernelCgroupFs,
) -> None:
    plan = make_plan()
    backend = CgroupfsBackend(fake_fs)
    applied = backend.apply(plan)

    assert applied.created == (SLICE, GROUP, LEAF)
    assert [(e.cgroup, set(e.controllers)) for e in applied.enabled] == [
        ("", set(plan.controllers)),
        (SLICE, set(plan.controllers)),
        (GROUP, set(plan.controllers)),
    ]
    assert [(r.cgroup, r.file, r.value) for r in applied.writes] == [
        (w.cgroup, w.file, w.value) for w in plan.writes
    ]
    previous = {(r.cgroup, r.file): r.previous for r in applied.writes}
    assert previous[(GROUP, files.MEMORY_HIGH)] == "max"
    assert previous[(GROUP, files.CPU_MAX)] == "max 100000"
    assert previous[(GROUP, files.IO_WEIGHT)] == "default 100"
    assert previous[(GROUP, files.CPUSET_CPUS)] == ""
    assert fake_fs.read(GROUP, files.MEMORY_HIGH) == str(MEMORY_HIGH)

    observed = backend.observe(plan)
    assert [o.write for o in observed] == list(plan.writes)
    assert all(o.matches for o in observed), [o for o in observed if not o.matches]


def test_observe_reports_drift_and_missing_files(fake_fs: FakeKernelCgroupFs) -> None:
    plan = make_plan()
    backend = CgroupfsBackend(fake_fs)
    before = backend.observe(plan)
    assert all(o.live is None and not o.matches for o in before)

    backend.apply(plan)
    fake_fs.write(GROUP, files.CPU_WEIGHT, "50")
    fake_fs.write(GROUP, files.CPUSET_CPUS, "1,2")  # same set as "1-2"
    drift = {o.write.file: o for o in backend.observe(plan) if o.write.cgroup == GROUP}
    assert (drift[files.CPU_WEIGHT].live, drift[files.CPU_WEIGHT].matches) == ("50", False)
    assert drift[files.CPUSET_CPUS].matches


def test_apply_twice_is_idempotent(fake_fs: FakeKernelCgroupFs, cgroup_root: Path) -> None:
    plan = make_plan()
    backend = CgroupfsBackend(fake_fs)
    backend.apply(plan)
    after_first = snapshot(cgroup_root)

    again = backend.apply(plan)

    assert again.created == ()
    assert again.enabled == ()
    assert all(r.previous == r.value for r in again.writes)
    assert snapshot(cgroup_root) == after_first


def test_apply_leaves_other_controllers_and_siblings_alone(tmp_path: Path) -> None:
    fs = _tree(tmp_path, "busy")
    sibling = f"{SLICE}/other"
    backend = CgroupfsBackend(fs)
    applied = backend.apply(make_plan())

    assert applied.created == (GROUP, LEAF)
    added = {e.cgroup: set(e.controllers) for e in applied.enabled}
    assert added[""] == {"cpuset", "io", "pids"}  # cpu and memory were on already
    assert added[SLICE] == {"pids", "io", "cpu", "cpuset"}
    assert fs.read(sibling, files.MEMORY_HIGH) == "1048576"
    assert next(r for r in applied.writes if r.cgroup == SLICE).previous == "65536"


def test_each_write_is_logged_with_its_previous_value(fake_fs: FakeKernelCgroupFs) -> None:
    with capture_logs() as logs:
        CgroupfsBackend(fake_fs).apply(make_plan())
    writes = [e for e in logs if e["event"] == "cgroup.write"]
    assert len(writes) == len(WRITES)
    high = next(e for e in writes if e["file"] == files.MEMORY_HIGH)
    assert (high["cgroup"], high["value"], high["previous"]) == (GROUP, str(MEMORY_HIGH), "max")


def test_applied_round_trips_through_json(fake_fs: FakeKernelCgroupFs) -> None:
    applied = CgroupfsBackend(fake_fs).apply(make_plan())
    assert Applied.from_json(applied.to_json()) == applied


# --- failures and rollback ---------------------------------------------------------------------


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_parametrized_steps_are_every_step_of_apply(tmp_path: Path, scenario: str) -> None:
    fs = _tree(tmp_path, scenario)
    CgroupfsBackend(fs).apply(make_plan())
    assert [(op, i) for i, (op, *_) in _numbered(fs.calls)] == STEPS


def _numbered(calls: list[tuple[str, str, str | None]]) -> list[tuple[int, tuple[str, ...]]]:
    seen: dict[str, int] = {}
    out: list[tuple[int, tuple[str, ...]]] = []
    for op, cgroup, file in calls:
        out.append((seen.get(op, 0), (op, cgroup, file or "")))
        seen[op] = seen.get(op, 0) + 1
    return out


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize(("op", "n"), STEPS, ids=[f"{op}{n}" for op, n in STEPS])
def test_failure_at_any_step_restores_the_tree_and_raises_the_original_error(
    tmp_path: Path, scenario: str, op: str, n: int
) -> None:
    fs = _tree(tmp_path, scenario, op=op, n=n)
    before = snapshot(fs.root)

    with pytest.raises(BackendError) as exc:
        CgroupfsBackend(fs).apply(make_plan())

    assert exc.value is fs.injected
    assert exc.value.errno == errno.EINVAL
    # every file has its previous value, created dirs are gone, added controllers removed,
    # pre-existing dirs and controllers untouched: the tree is byte for byte what it was
    assert snapshot(fs.root) == before


def test_a_rollback_failure_is_logged_and_the_original_error_still_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = _tree(tmp_path, "fresh", op="write", n=len(WRITES) - 1)

    def broken_rmdir(cgroup: str) -> None:
        raise BackendError("cannot remove cgroup", cgroup=cgroup, errno=errno.EBUSY)

    monkeypatch.setattr(fs, "rmdir", broken_rmdir)
    with capture_logs() as logs, pytest.raises(BackendError) as exc:
        CgroupfsBackend(fs).apply(make_plan())
    assert exc.value is fs.injected
    failed = [e for e in logs if e["event"] == "rollback.failed"]
    assert [(e["step"], e["cgroup"]) for e in failed][:3] == [
        ("rmdir", LEAF),
        ("rmdir", GROUP),
        ("rmdir", SLICE),
    ]


def test_missing_controller_is_host_error_69_and_nothing_is_created(tmp_path: Path) -> None:
    root = make_root(tmp_path / "cgroup", controllers=("cpu", "memory", "pids"))
    before = snapshot(root)
    with pytest.raises(HostError) as exc:
        CgroupfsBackend(FakeKernelCgroupFs(root)).apply(make_plan())
    assert exc.value.exit_code == 69
    assert exc.value.missing == ("io", "cpuset")
    assert "io, cpuset" in str(exc.value)
    assert files.CGROUP_CONTROLLERS in str(exc.value)
    assert snapshot(root) == before


def test_permission_denied_is_exit_77_with_coordinates_and_rolls_back(tmp_path: Path) -> None:
    fs = _tree(tmp_path, "fresh", op="write", n=3, code=errno.EACCES)
    before = snapshot(fs.root)
    with pytest.raises(PermissionDenied) as exc:
        CgroupfsBackend(fs).apply(make_plan())
    err = exc.value
    assert err.exit_code == 77
    assert (err.cgroup, err.file, err.value, err.errno) == (
        GROUP,
        files.MEMORY_HIGH,
        str(MEMORY_HIGH),
        errno.EACCES,
    )
    assert snapshot(fs.root) == before


def test_a_real_enoent_from_a_missing_controller_file_rolls_back(tmp_path: Path) -> None:
    """Not injected: the plan writes hugetlb, the fake kernel has no such file (no O_CREAT)."""
    fs = _tree(tmp_path, "fresh")
    before = snapshot(fs.root)
    plan = make_plan(writes=(*WRITES, replace(WRITES[0], file="rdma.max")))
    with pytest.raises(BackendError) as exc:
        CgroupfsBackend(fs).apply(plan)
    assert (exc.value.file, exc.value.errno) == ("rdma.max", errno.ENOENT)
    assert snapshot(fs.root) == before


def test_rollback_from_a_state_file_in_another_process_restores_the_tree(
    tmp_path: Path,
) -> None:
    fs = _tree(tmp_path, "busy")
    before = snapshot(fs.root)
    state = CgroupfsBackend(fs).apply(make_plan()).to_json()

    later = CgroupfsBackend(FakeKernelCgroupFs(fs.root))
    later.rollback(Applied.from_json(state))
    assert snapshot(fs.root) == before
    later.rollback(Applied.from_json(state))  # twice: nothing left to do
    assert snapshot(fs.root) == before


# --- remove ------------------------------------------------------------------------------------


def test_remove_after_apply_leaves_the_tree_as_before_except_root_controllers(
    fake_fs: FakeKernelCgroupFs, cgroup_root: Path
) -> None:
    before = snapshot(cgroup_root)
    backend = CgroupfsBackend(fake_fs)
    backend.apply(make_plan())

    removed = backend.remove(make_plan())

    assert removed.killed is False
    assert removed.removed == (LEAF, GROUP, SLICE)
    after = snapshot(cgroup_root)
    # remove does not disable controllers on ancestors: other cgroups may rely on them
    assert after.pop(files.CGROUP_SUBTREE_CONTROL) == "cpuset cpu io memory pids"
    before.pop(files.CGROUP_SUBTREE_CONTROL)
    assert after == before


def test_remove_is_idempotent(fake_fs: FakeKernelCgroupFs) -> None:
    backend = CgroupfsBackend(fake_fs)
    assert backend.remove(make_plan()).removed == ()  # never applied
    backend.apply(make_plan())
    backend.remove(make_plan())
    assert backend.remove(make_plan()).removed == ()


def test_remove_keeps_a_slice_that_other_policies_still_use(tmp_path: Path) -> None:
    fs = _tree(tmp_path, "busy")
    backend = CgroupfsBackend(fs)
    backend.apply(make_plan())
    removed = backend.remove(make_plan())
    assert removed.removed == (LEAF, GROUP)
    assert removed.kept == (SLICE,)
    assert fs.exists(f"{SLICE}/other")


def test_remove_kills_a_populated_group_with_cgroup_kill(fake_fs: FakeKernelCgroupFs) -> None:
    backend = CgroupfsBackend(fake_fs, kill_pid=_must_not_be_called)
    backend.apply(make_plan())
    fake_fs.add_process(LEAF, 4242)

    removed = backend.remove(make_plan())

    assert removed.killed is True
    assert not fake_fs.exists(SLICE)


def _must_not_be_called(pid: int, sig: int) -> None:
    raise AssertionError(f"kill({pid}, {sig}) with cgroup.kill available")


def test_remove_without_cgroup_kill_sigkills_every_pid(tmp_path: Path) -> None:
    """Kernels before 5.14 have no cgroup.kill: SIGKILL each pid, wait for populated 0."""
    fs = FakeKernelCgroupFs(make_root(tmp_path / "cgroup"), has_kill=False)
    killed: list[tuple[int, int]] = []

    def kill_pid(pid: int, sig: int) -> None:
        killed.append((pid, sig))
        fs.reap(pid)

    backend = CgroupfsBackend(fs, kill_pid=kill_pid, sleep=lambda s: None)
    backend.apply(make_plan())
    fs.add_process(LEAF, 4242)
    fs.add_process(LEAF, 4243)

    assert backend.remove(make_plan()).killed is True
    assert sorted(killed) == [(4242, signal.SIGKILL), (4243, signal.SIGKILL)]
    assert not fs.exists(GROUP)


def test_remove_gives_up_after_the_timeout_when_processes_do_not_exit(tmp_path: Path) -> None:
    fs = FakeKernelCgroupFs(make_root(tmp_path / "cgroup"), has_kill=False)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    backend = CgroupfsBackend(fs, kill_pid=lambda pid, sig: None, sleep=sleep, clock=lambda: now[0])
    backend.apply(make_plan())
    fs.add_process(LEAF, 4242)
    with pytest.raises(BackendError) as exc:
        backend.remove(make_plan())
    assert (exc.value.cgroup, exc.value.file) == (GROUP, files.CGROUP_EVENTS)
    assert 5.0 <= now[0] < 5.1
    assert fs.exists(LEAF)


# --- lock --------------------------------------------------------------------------------------


def test_a_second_lock_on_the_same_group_is_host_error(fake_fs: FakeKernelCgroupFs) -> None:
    plan = make_plan()
    first = CgroupfsBackend(fake_fs)
    second = CgroupfsBackend(FakeKernelCgroupFs(fake_fs.root))
    with first.lock(plan):
        assert fake_fs.exists(GROUP)
        with pytest.raises(HostError) as exc, second.lock(plan):
            pass
        assert str(exc.value) == (
            f"policy npu-chat is already running in {GROUP} (a lock on {fake_fs.root}/{GROUP})"
        )
        assert exc.value.hint == "stop the other launch or use a different policy name"
        assert exc.value.exit_code == 69
        assert fake_fs.exists(GROUP)  # the loser does not clean up the winner's group
    with second.lock(plan):  # released on exit
        pass


def test_lock_removes_the_dirs_it_created_when_apply_rolled_back(tmp_path: Path) -> None:
    fs = _tree(tmp_path, "fresh", op="write", n=0)
    before = snapshot(fs.root)
    backend = CgroupfsBackend(fs)
    with pytest.raises(BackendError), backend.lock(make_plan()):
        backend.apply(make_plan())
    assert snapshot(fs.root) == before


def test_lock_keeps_a_group_that_is_still_running(fake_fs: FakeKernelCgroupFs) -> None:
    backend = CgroupfsBackend(fake_fs)
    with backend.lock(make_plan()):
        backend.apply(make_plan())
        fake_fs.add_process(LEAF, 4242)
    assert fake_fs.procs(LEAF) == [4242]
