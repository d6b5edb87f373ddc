"""kill_tree on a kernel without cgroup.kill (governor/kernel/kill.py, issue 43 low): it says
what it did when the freeze failed, and the prefetch helper's fail-closed kill (launch/helper.py
kill_own_group) uses it from inside the group: the caller spared, the group never frozen.
Needs: the fake cgroup tree (tests/fakefs)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from governor.kernel import files
from governor.kernel.kill import kill_tree
from governor.launch.helper import kill_own_group

from .fakekernel import FakeKernelCgroupFs

GROUP, LEAF = "governor.slice/chat", "governor.slice/chat/engine"


def _old_kernel(cgroup_root: Path) -> FakeKernelCgroupFs:
    fs = FakeKernelCgroupFs(cgroup_root, has_kill=False)
    for cg in ("governor.slice", GROUP, LEAF):
        fs.mkdir(cg)
    fs.add_process(LEAF, 4242)
    fs.add_process(LEAF, 4243)
    return fs


def _killer(
    fs: FakeKernelCgroupFs, sent: list[int], freezes: list[str]
) -> Callable[[int, int], None]:
    def kill(pid: int, sig: int) -> None:
        assert sig == signal.SIGKILL
        if (fs.path(GROUP) / files.CGROUP_FREEZE).exists():
            freezes.append(fs.read(GROUP, files.CGROUP_FREEZE).strip())
        sent.append(pid)
        fs.reap(pid)

    return kill


def test_a_failed_freeze_is_reported_as_such_not_as_frozen(cgroup_root: Path) -> None:
    fs = _old_kernel(cgroup_root)
    (fs.path(GROUP) / files.CGROUP_FREEZE).unlink()  # a kernel before 5.2, or a failed write
    sent: list[int] = []
    how = kill_tree(fs, GROUP, _killer(fs, sent, []))
    assert how is not None
    assert how.startswith("no cgroup.kill (Linux < 5.14): could not freeze the group (")
    assert how.endswith("), SIGKILLed each pid")
    assert "froze the group" not in how
    assert sorted(sent) == [4242, 4243] and fs.procs(LEAF) == []


def test_a_frozen_group_is_still_reported_as_frozen_and_thawed(cgroup_root: Path) -> None:
    fs = _old_kernel(cgroup_root)
    sent: list[int] = []
    freezes: list[str] = []
    how = kill_tree(fs, GROUP, _killer(fs, sent, freezes))
    assert how == "no cgroup.kill (Linux < 5.14): froze the group, SIGKILLed each pid"
    assert set(freezes) == {"1"} and sorted(sent) == [4242, 4243]
    assert fs.read(GROUP, files.CGROUP_FREEZE).strip() == "0"


def test_a_caller_inside_the_group_is_spared_and_the_group_never_frozen(
    cgroup_root: Path,
) -> None:
    """The prefetch helper kills its own group: a freeze would stop it before its first
    SIGKILL (it is in the group), and it must not SIGKILL itself before the others."""
    fs = _old_kernel(cgroup_root)
    fs.add_process(LEAF, 4300)  # the helper
    sent: list[int] = []
    freezes: list[str] = []
    how = kill_tree(fs, GROUP, _killer(fs, sent, freezes), inside=4300)
    assert how == (
        "no cgroup.kill (Linux < 5.14): the group not frozen (the caller is in it),"
        " SIGKILLed each pid"
    )
    assert sorted(sent) == [4242, 4243] and set(freezes) == {"0"}
    assert fs.procs(LEAF) == [4300]


def test_the_prefetch_helper_kills_its_group_without_cgroup_kill(cgroup_root: Path) -> None:
    """Before issue 43 the helper wrote cgroup.kill only: on 5.10 (no such file) its
    fail-closed kill raised and the engine kept running without the promised mlock."""
    fs = _old_kernel(cgroup_root)
    me = os.getpid()
    fs.add_process(LEAF, me)
    sent: list[int] = []
    freezes: list[str] = []
    kill_own_group(fs, GROUP, _killer(fs, sent, freezes))
    assert sorted(sent) == [4242, 4243] and fs.procs(LEAF) == [me]
    assert set(freezes) == {"0"}
