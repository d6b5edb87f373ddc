"""Names from peers are mapped, never trusted (issue 43 items 9 and 10) on a fake cgroup tree
and a fake /proc: the router's children named like llama.cpp's preset example
(``org/tiny:Q8_0``) or like an interface file (``memory.max``) get a leaf of their own with
their limits; one child whose name maps to no leaf, or whose leaf the kernel refuses, is
logged and journaled once and skipped while every other child is placed; the evictor makes
room past odd names. The real kernel: tests/kernel/test_router_guest.py."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from governor.errors import BackendError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import translate
from governor.log import capture_logs
from governor.rundir.journal import Journal
from governor.supervise.activity import Activity
from governor.supervise.models import ModelLeaves, ModelLimits

from .test_model_leaves import GROUP, LEAF, ROUTER, MovingFs, _child
from .test_router_evict import FakeRouter, _leaves, _spawn, _usage

MIB = 1 << 20


class RefusingFs(MovingFs):
    """The kernel refuses to create the leaves in ``refuse`` (EINVAL, as cgroup_mkdir does
    for a name with a newline), whatever their name is."""

    def __init__(self, root: Path, refuse: set[str]) -> None:
        super().__init__(root)
        self.refuse = refuse
        self.mkdirs: list[str] = []

    def mkdir(self, cgroup: str) -> bool:
        self.mkdirs.append(cgroup)
        if cgroup.rsplit("/", 1)[-1] in self.refuse:
            err = OSError(errno.EINVAL, "Invalid argument")
            raise translate(err, "cannot create cgroup", cgroup=cgroup) from err
        return super().mkdir(cgroup)


def _tree(root: Path, proc: Path, children: dict[int, str], refuse: set[str]) -> RefusingFs:
    fs = RefusingFs(root, refuse)
    fs.enable("", ["memory", "cpu"])
    fs.mkdir("governor.slice")
    fs.enable("governor.slice", ["memory", "cpu"])
    fs.mkdir(GROUP)
    fs.mkdir(LEAF)
    _spawn(fs, proc, 100, ROUTER)
    for pid, alias in children.items():
        _spawn(fs, proc, pid, _child(alias))
    return fs


def test_odd_names_get_a_leaf_of_their_own_with_their_limits(
    cgroup_root: Path, tmp_path: Path
) -> None:
    proc = tmp_path / "proc"
    fs = _tree(cgroup_root, proc, {101: "org/tiny:Q8_0", 102: "memory.max", 103: "tiny"}, set())
    limits = {
        "org/tiny:Q8_0": ModelLimits(max=300 * MIB),
        "memory.max": ModelLimits(max=200 * MIB, oom_group=True),
    }
    leaves = ModelLeaves(
        fs, group=GROUP, leaf=LEAF, limits=limits, router_pid=lambda: 100, proc_root=proc,
        activity=Activity(fs, GROUP),
    )  # fmt: skip
    assert leaves.poll() == [(101, "org/tiny:Q8_0"), (102, "memory.max"), (103, "tiny")]
    models = f"{GROUP}/models"
    assert fs.children(models) == [f"{models}/_memory.max", f"{models}/org%2Ftiny:Q8_0",
                                   f"{models}/tiny"]  # fmt: skip
    assert fs.procs(f"{models}/org%2Ftiny:Q8_0") == [101]
    assert fs.read(f"{models}/org%2Ftiny:Q8_0", kf.MEMORY_MAX).strip() == str(300 * MIB)
    assert fs.procs(f"{models}/_memory.max") == [102]
    assert fs.read(f"{models}/_memory.max", kf.MEMORY_MAX).strip() == str(200 * MIB)
    assert fs.read(models, kf.MEMORY_MAX).strip() == "max"  # the interface file untouched
    assert fs.procs(LEAF) == [100]
    assert leaves.published()["models"] == {
        "memory.max": {"last_request": leaves.activity.last["memory.max"],  # type: ignore[union-attr]
                       "leaf": "_memory.max"},
        "org/tiny:Q8_0": {"last_request": leaves.activity.last["org/tiny:Q8_0"],  # type: ignore[union-attr]
                          "leaf": "org%2Ftiny:Q8_0"},
        "tiny": {"last_request": leaves.activity.last["tiny"], "leaf": "tiny"},  # type: ignore[union-attr]
    }  # fmt: skip
    # the activity dates the model, not its leaf, and asks the router by the model's name
    assert leaves.activity is not None
    leaves.activity.last.clear()
    _usage(fs, "org%2Ftiny:Q8_0", 0)
    leaves.activity.sample()
    _usage(fs, "org%2Ftiny:Q8_0", 50_000)
    assert leaves.activity.sample() is True
    assert set(leaves.activity.last) == {"org/tiny:Q8_0"}


def test_one_child_refused_a_leaf_is_said_once_and_every_other_child_is_placed(
    cgroup_root: Path, tmp_path: Path
) -> None:
    """Issue 43 item 9: the kernel refused one child's leaf inside every poll (every 20 ms)
    and the children after it never got a leaf."""
    proc = tmp_path / "proc"
    children = {101: "a\nb", 102: "bad", 103: "good", 104: "org/x"}
    fs = _tree(cgroup_root, proc, children, refuse={"bad"})
    journal = Journal(tmp_path / "run" / "r")
    leaves = ModelLeaves(
        fs, group=GROUP, leaf=LEAF, limits={}, router_pid=lambda: 100, proc_root=proc,
        journal=journal,
    )  # fmt: skip
    with capture_logs() as logs:
        assert leaves.poll() == [(103, "good"), (104, "org/x")]
        mkdirs = len(fs.mkdirs)
        _spawn(fs, proc, 105, _child("late"))  # a child the router starts afterwards
        for _ in range(5):
            moved = leaves.poll()
            if moved:
                assert moved == [(105, "late")]
    assert fs.procs(f"{GROUP}/models/good") == [103]
    assert fs.procs(f"{GROUP}/models/org%2Fx") == [104]
    assert fs.procs(f"{GROUP}/models/late") == [105]
    assert fs.procs(LEAF) == [100, 101, 102]  # the refused stay under the engine's limits
    assert fs.mkdirs[mkdirs:] == [f"{GROUP}/models/late"]  # the refused are not retried
    refused = [e for e in logs if e["event"] == "model.refused"]
    assert [(e["alias"], e["log_level"]) for e in refused] == [
        ("a\nb", "warning"), ("bad", "warning")
    ]  # fmt: skip
    assert "control character" in refused[0]["error"]
    assert "Invalid argument" in refused[1]["error"] or "EINVAL" in refused[1]["error"]
    entries = journal.entries()
    assert [(e["source"], e["model"]) for e in entries] == [("models", "a\nb"), ("models", "bad")]
    assert all("left in the engine leaf" in e["error"] for e in entries)
    assert sorted(leaves.refused) == ["a\nb", "bad"]


def test_a_leaf_whose_limits_the_kernel_refuses_is_removed_never_used_without_them(
    cgroup_root: Path, tmp_path: Path
) -> None:
    proc = tmp_path / "proc"
    fs = _tree(cgroup_root, proc, {101: "x", 102: "y"}, set())
    real_write = fs.write

    def write(cgroup: str, file: str, value: str) -> None:
        if cgroup.endswith("/models/x") and file == kf.MEMORY_MAX:
            raise BackendError("cannot write cgroup file: EINVAL", cgroup=cgroup, file=file)
        real_write(cgroup, file, value)

    fs.write = write  # type: ignore[method-assign]
    leaves = ModelLeaves(
        fs, group=GROUP, leaf=LEAF, router_pid=lambda: 100, proc_root=proc,
        limits={"x": ModelLimits(max=MIB), "y": ModelLimits(max=MIB)},
    )  # fmt: skip
    assert leaves.poll() == [(102, "y")]
    assert leaves.poll() == []
    assert not fs.exists(f"{GROUP}/models/x")
    assert fs.procs(LEAF) == [100, 101]


@pytest.mark.parametrize("odd", ["..", "a\nb", "org/a"])
def test_make_room_unloads_past_models_with_odd_names(
    cgroup_root: Path, tmp_path: Path, odd: str
) -> None:
    """A name with '..' crashed Evictor.make_room (ValueError: eviction abandoned)."""
    proc = tmp_path / "proc"
    fs = _tree(cgroup_root, proc, {}, set())
    fs.write(GROUP, kf.MEMORY_MAX, str(200 * MIB))
    (fs.root / LEAF / kf.MEMORY_CURRENT).write_text(f"{20 * MIB}\n")
    fs.enable(GROUP, ["memory"])
    fs.mkdir(f"{GROUP}/models")
    fs.enable(f"{GROUP}/models", ["memory"])
    fs.mkdir(f"{GROUP}/models/org%2Fb")  # a loaded model with a mapped leaf
    fs.add_process(f"{GROUP}/models/org%2Fb", 102)
    if odd == "org/a":  # a model with a leaf of its own, else one left in the engine leaf
        fs.mkdir(f"{GROUP}/models/org%2Fa")
        fs.add_process(f"{GROUP}/models/org%2Fa", 101)
    else:
        fs.add_process(LEAF, 101)
    _spawn(fs, proc, 103, _child("c"))
    router = FakeRouter(fs, {odd: 101, "org/b": 102, "c": 103})
    leaves, ev = _leaves(fs, proc, router)
    ev.claims = {odd: 100 * MIB, "org/b": 100 * MIB, "c": 100 * MIB}
    ev.activity.last.clear()
    ev.activity.last.update({odd: 1000.0, "org/b": 2000.0})
    assert sorted(ev.loaded("c")) == sorted({"org/b", *([odd] if odd == "org/a" else [])})
    assert leaves.poll() == [(103, "c")]
    assert router.unloaded == [odd, "org/b"][: len(router.unloaded)]
    assert "org/b" in router.unloaded  # the eviction went on past the odd name
    assert fs.read(f"{GROUP}/models/c", kf.CGROUP_FREEZE).strip() == "0"
