"""One leaf per model of llama-server's router (governor/supervise/models.py) on a fake cgroup
tree and a fake /proc: children found by their --alias, moved into <group>/models/<alias>
with the limits written first, the router and not-yet-exec'd children left in the engine leaf.
The real router in a real kernel: tests/kernel/test_router_guest.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from governor.api.launch import model_leaves
from governor.kernel import files as kf
from governor.plan.model import EngineSpec, RouterModelSpec
from governor.supervise.models import ModelLeaves, ModelLimits, child_alias

from .fakekernel import FakeKernelCgroupFs

MIB = 1 << 20
GROUP = "governor.slice/r"
LEAF = f"{GROUP}/engine"
ROUTER = b"/opt/llama/bin/llama-server\0--models-dir\0/m\0-c\0256\0"


def _child(alias: str) -> bytes:
    return (
        b"/opt/llama/bin/llama-server\0--host\0127.0.0.1\0--port\x0041233\0--alias\0"
        + alias.encode()
        + b"\0--ctx-size\x00256\0--model\0/m/x.gguf\0"
    )


class MovingFs(FakeKernelCgroupFs):
    """The kernel's side of a write to cgroup.procs: the process leaves its old cgroup; every
    write is recorded in order. A move is atomic, as the kernel's is: the fake's cgroup.procs
    are files rewritten whole, so a move (the placement thread's) and a test's spawn into the
    same leaf would otherwise lose one of the two (the spawned pid vanished: "d placed" never
    came, under load); and a move is recorded once done, so a test that waits for its record
    sees the tree after it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: list[tuple[str, str, str]] = []
        self._procs_lock = threading.RLock()

    def write(self, cgroup: str, file: str, value: str) -> None:
        self.writes.append((cgroup, file, value))
        super().write(cgroup, file, value)

    def add_process(self, cgroup: str, pid: int) -> None:
        with self._procs_lock:
            super().add_process(cgroup, pid)

    def reap(self, pid: int) -> None:
        with self._procs_lock:
            super().reap(pid)

    def move(self, pid: int, cgroup: str) -> None:
        with self._procs_lock:
            self.reap(pid)
            self.add_process(cgroup, pid)
            self.writes.append((cgroup, kf.CGROUP_PROCS, str(pid)))


@pytest.fixture
def tree(cgroup_root: Path, tmp_path: Path) -> tuple[MovingFs, Path]:
    fs = MovingFs(cgroup_root)
    fs.enable("", ["memory", "pids"])
    fs.mkdir("governor.slice")
    fs.enable("governor.slice", ["memory", "pids"])
    fs.mkdir(GROUP)  # the plan enables memory down to the group only (its limits are there)
    fs.mkdir(LEAF)
    proc = tmp_path / "proc"
    for pid, cmdline in ((100, ROUTER), (101, _child("small")), (102, ROUTER)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(cmdline)
        fs.add_process(LEAF, pid)
    return fs, proc


def test_children_move_to_their_models_leaf_with_its_limits_written_first(
    tree: tuple[MovingFs, Path],
) -> None:
    fs, proc = tree
    leaves = ModelLeaves(
        fs,
        group=GROUP,
        leaf=LEAF,
        limits={"small": ModelLimits(max=300 * MIB, high=250 * MIB, oom_group=True)},
        router_pid=lambda: 100,
        proc_root=proc,
    )
    assert leaves.poll() == [(101, "small")]
    small = f"{GROUP}/models/small"
    assert fs.procs(small) == [101]
    assert fs.procs(LEAF) == [100, 102]  # the router, and a child not exec'd yet
    assert fs.read(small, kf.MEMORY_MAX).strip() == str(300 * MIB)
    assert fs.read(small, kf.MEMORY_HIGH).strip() == str(250 * MIB)
    assert fs.read(small, kf.MEMORY_OOM_GROUP).strip() == "1"
    assert fs.subtree_control(GROUP) == fs.subtree_control(f"{GROUP}/models") == {"memory"}
    order = [(c, f) for c, f, _v in fs.writes if c == small]
    assert order.index((small, kf.MEMORY_MAX)) < order.index((small, kf.CGROUP_PROCS))
    # the second child execs; a model with no limits gets a leaf of its own, nothing written
    (proc / "102" / "cmdline").write_bytes(_child("tiny"))
    assert leaves.poll() == [(102, "tiny")]
    assert fs.procs(LEAF) == [100]
    assert fs.read(f"{GROUP}/models/tiny", kf.MEMORY_MAX).strip() == "max"
    assert leaves.poll() == []  # nothing left to move
    assert leaves.placed == {101: "small", 102: "tiny"}


def test_a_child_that_exits_before_it_is_read_is_skipped(tree: tuple[MovingFs, Path]) -> None:
    fs, proc = tree
    (proc / "101" / "cmdline").unlink()
    leaves = ModelLeaves(fs, group=GROUP, leaf=LEAF, limits={}, router_pid=lambda: 100,
                         proc_root=proc)  # fmt: skip
    assert leaves.poll() == []


@pytest.mark.parametrize(
    ("cmdline", "alias"),
    [
        (b"llama-server\0--alias\0small\0--model\0/m/s.gguf\0", "small"),
        (b"llama-server\0--alias=small\0", "small"),
        (b"llama-server\0-a\0a,b\0", "a"),  # a list of aliases: the first names the leaf
        (b"llama-server\0--alias\0x\0--alias\0y\0", "y"),  # the last one given wins
        # the router's name as it is: its leaf is kernel/leafname.py's mapping
        (b"llama-server\0--alias\0../up\0", "../up"),
        (b"llama-server\0--alias\0org/tiny:Q8_0\0", "org/tiny:Q8_0"),
        (b"llama-server\0--models-dir\0/m\0", None),  # the router itself
        (b"llama-server\0--alias\0", None),
        (b"", None),
        # llama.cpp's grammar (plan/llama_args.py options): another option's value is no alias
        (b"llama-server\0-p\0--alias\0x\0", None),
        (b"llama-server\0--alias\0a\0--system-prompt\0-a\0b\0", "a"),
        (b"llama-server\0--alias\0\xffx\0", "\ufffdx"),  # not UTF-8: replaced, as before
    ],
)
def test_the_alias_is_read_from_the_childs_cmdline(cmdline: bytes, alias: str | None) -> None:
    assert child_alias(cmdline) == alias


def test_a_models_leaf_defaults_to_its_estimate_plus_headroom_and_a_table_overrides() -> None:
    from governor.engines.budget import headroom_for
    from governor.plan.model import Plan

    class _Plan:
        engine = EngineSpec(
            kind="llama.cpp",
            models=(
                RouterModelSpec(alias="small", high=200 * MIB, oom_group=True),
                RouterModelSpec(alias="big", max=900 * MIB),
                RouterModelSpec(alias="elsewhere", max=50 * MIB),
            ),
        )

    plan: Plan = _Plan()  # type: ignore[assignment]  # only .engine is read
    totals = {"small": 300 * MIB, "big": 800 * MIB, "tiny": 30 * MIB}
    estimate = {"router": totals, "router_max": {a: t + headroom_for(t) for a, t in totals.items()}}
    got = model_leaves(plan, estimate)
    assert got is not None
    limits = {a: ModelLimits.read(v) for a, v in got.items()}
    assert limits == {
        "small": ModelLimits(max=300 * MIB + 64 * MIB, high=200 * MIB, oom_group=True),
        "big": ModelLimits(max=900 * MIB),
        "tiny": ModelLimits(max=30 * MIB + 64 * MIB),  # headroom: at least 64 MiB (init's)
        "elsewhere": ModelLimits(max=50 * MIB),
    }
    assert model_leaves(plan, None) is None
    assert model_leaves(plan, {"model": "x.gguf", "total": 1}) is None


def test_an_exec_on_the_board_moves_the_child_at_once_not_a_poll_later(
    tree: tuple[MovingFs, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's exec event (kernel/procevents.py) wakes the placement thread: with a poll
    of a minute, each child is moved right after the exec that named it (issue 46 item 5: what
    a child charges before its move stays in the router's leaf)."""
    import threading

    from governor.supervise import models

    fs, proc = tree
    wakes: list[threading.Event] = []

    class Waker:
        @classmethod
        def start(cls, wake: threading.Event) -> Waker:
            wakes.append(wake)
            return cls()

        def stop(self) -> None:
            pass

    monkeypatch.setattr(models, "POLL_S", 60.0)
    monkeypatch.setattr(models, "ExecWaker", Waker)
    placed: list[tuple[str, int]] = []
    moved = threading.Semaphore(0)

    def on_place(alias: str, pid: int, _cg: str) -> None:
        placed.append((alias, pid))
        moved.release()

    leaves = ModelLeaves(fs, group=GROUP, leaf=LEAF, limits={}, router_pid=lambda: 100,
                         proc_root=proc, on_place=on_place).start()  # fmt: skip
    try:
        (wake,) = wakes
        wake.set()  # 101 exec'd
        assert moved.acquire(timeout=10)
        (proc / "102" / "cmdline").write_bytes(_child("tiny"))
        wake.set()  # 102 exec'd
        assert moved.acquire(timeout=10)
    finally:
        leaves.stop()
    assert placed == [("small", 101), ("tiny", 102)]
