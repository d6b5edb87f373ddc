"""remove takes away only what this governor made (an operator's slice stays, even empty), a
remove that races a launch's own cleanup is not an error, and `governor apply` waits for no
one: it refuses while a launch of the same policy holds the group's lock.

Needs: a tmp directory (the fake tree); flock on a directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.backends.cgroupfs import CgroupfsBackend

from .fakekernel import FakeKernelCgroupFs
from .plans import GROUP, LEAF, SLICE, make_plan


def test_an_operators_empty_slice_is_kept_and_one_the_run_created_goes(
    fake_fs: FakeKernelCgroupFs,
) -> None:
    backend = CgroupfsBackend(fake_fs)
    plan = make_plan()
    fake_fs.mkdir(SLICE)  # the operator's, before any governor ran
    with backend.lock(plan) as locked:
        applied = backend.apply(plan)
    owned = set(locked) | set(applied.created)
    assert SLICE not in owned
    removed = backend.remove(plan, owned=owned)
    assert fake_fs.exists(SLICE) and SLICE in removed.kept
    assert not fake_fs.exists(GROUP)

    fake_fs.rmdir(SLICE)
    with backend.lock(plan) as locked:
        applied = backend.apply(plan)
    owned = set(locked) | set(applied.created)
    assert SLICE in owned
    backend.remove(plan, owned=owned)
    assert not fake_fs.exists(SLICE)


class VanishingFs(FakeKernelCgroupFs):
    """The group disappears right after remove() saw it exist: a launch's own cleanup won."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.armed = False

    def exists(self, cgroup: str) -> bool:
        found = super().exists(cgroup)
        if self.armed and found and cgroup == GROUP:
            self.armed = False
            for gone in (LEAF, GROUP):
                super().rmdir(gone)
        return found


def test_a_remove_racing_the_launchs_own_cleanup_is_not_an_error(cgroup_root: Path) -> None:
    fs = VanishingFs(cgroup_root)
    backend = CgroupfsBackend(fs)
    plan = make_plan()
    backend.apply(plan)
    fs.armed = True
    removed = backend.remove(plan)  # was: BackendError ENOENT on cgroup.events (71)
    assert not fs.exists(GROUP)
    assert removed.killed is False


def test_apply_refuses_while_a_launch_holds_the_policys_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import fcntl
    import os
    import shutil

    from governor.cli.app import main

    hosts = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "rk3588"
    root = tmp_path / "cgroup"
    shutil.copytree(hosts / "sys" / "fs" / "cgroup", root)
    policy = tmp_path / "ap.toml"
    policy.write_text('name = "ap"\n[process]\noom_score_adj = 10\n')
    group = root / "governor.slice" / "ap"
    controllers = (root / "cgroup.subtree_control").read_text()
    for d in (group.parent, group):  # what the kernel shows in a new cgroup
        d.mkdir()
        (d / "cgroup.controllers").write_text(controllers)
        (d / "cgroup.subtree_control").write_text("")
    fd = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running `governor launch` of "ap" holds
    try:
        with pytest.raises(SystemExit) as info:
            main(["--root", str(hosts), "--cgroup-root", str(root), "apply", str(policy)])
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert info.value.code == 69, err
    assert "already running" in err
