"""The launcher's fallback when clone3(CLONE_INTO_CGROUP) cannot be used (governor/launch/
launcher.py spawn, governor/kernel/clone.py): on a fake tree the leaf is a plain directory, so
the kernel answers EBADF, clone_into returns None, and the launcher forks a child that writes
its own pid into the leaf's cgroup.procs before it execs the engine.

Needs: a tmp directory, fork/exec, /bin/sh. The clone3 path itself is tested on the host's
cgroup2 mount in tests/runtime/test_clone.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from governor.backends.cgroupfs import CgroupfsBackend
from governor.kernel import clone, files
from governor.launch.launcher import ChildSetup, Launcher

from .fakekernel import FakeKernelCgroupFs
from .plans import make_plan


def test_clone_into_a_plain_directory_returns_none(fake_fs: FakeKernelCgroupFs) -> None:
    plan = make_plan()
    CgroupfsBackend(fake_fs).apply(plan)
    fd = fake_fs.open_dir(plan.leaf)
    try:
        assert clone.clone_into(fd) is None
    finally:
        os.close(fd)


def test_spawn_forks_a_child_that_has_not_joined_yet(fake_fs: FakeKernelCgroupFs) -> None:
    plan = make_plan()
    CgroupfsBackend(fake_fs).apply(plan)
    pid, born_in_leaf = Launcher(fake_fs).spawn(plan.leaf)
    if pid == 0:  # pragma: no cover - the child
        os._exit(0)
    os.waitpid(pid, 0)
    assert born_in_leaf is False  # so the child writes cgroup.procs itself (Launcher._child)


def test_the_engine_writes_itself_into_the_leaf_before_exec(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    plan = make_plan()
    CgroupfsBackend(fake_fs).apply(plan)
    pid_file = tmp_path / "engine.pid"
    argv = ("/bin/sh", "-c", f'echo $$ > "{pid_file}"')
    setup = ChildSetup(executable=argv[0], argv=argv, env=dict(os.environ), pdeathsig=False)
    pid = Launcher(fake_fs).start(plan, setup)  # returns once the child has exec'd
    assert (fake_fs.path(plan.leaf) / files.CGROUP_PROCS).read_text().split() == [str(pid)]
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pid_file.read_text().split() == [str(pid)]  # the pid that joined is the engine's
