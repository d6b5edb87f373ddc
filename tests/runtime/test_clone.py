"""clone3(CLONE_INTO_CGROUP) (governor/kernel/clone.py) on the host's cgroup2 mount: the child
is born in the target cgroup (its first exec'd program already reads it there), and a
directory fd that is not a cgroup2 directory (EBADF) is a fallback for that call only, not for
the rest of the process. The launcher's fork + cgroup.procs fallback on a fake tree is in
tests/fakefs/test_launch_fallback.py.

Needs what tests/runtime/conftest.py says; clone3 with CLONE_INTO_CGROUP (Linux 5.7).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.cgroups import ScratchSlice

from governor.kernel import clone


def _cat_self_cgroup_from(dirfd: int) -> tuple[int, str] | None:
    """clone_into(dirfd); the child execs `cat /proc/self/cgroup` as its first program.
    (pid, what cat printed), or None when clone_into fell back."""
    r, w = os.pipe()
    try:
        born = clone.clone_into(dirfd)
        if born is None:
            return None
        pid, pidfd = born
        if pid == 0:  # pragma: no cover - the child: only dup2 before exec
            try:
                os.dup2(w, 1)
                os.execv("/bin/cat", ["cat", "/proc/self/cgroup"])
            finally:
                os._exit(127)
        os.close(pidfd)
        os.close(w)
        w = -1
        chunks = []
        while chunk := os.read(r, 4096):
            chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        return pid, b"".join(chunks).decode()
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def _cgroup2_line(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("0::")]
    return line[3:]


@pytest.fixture
def target(scratch_slice: ScratchSlice) -> Iterator[int]:
    """An open directory fd of a fresh scratch cgroup."""
    scratch_slice.create()
    fd = os.open(scratch_slice.child("born-here"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


def test_a_cloned_child_is_born_in_the_target_cgroup(
    target: int, scratch_slice: ScratchSlice
) -> None:
    assert clone._STATE.unsupported is False
    got = _cat_self_cgroup_from(target)
    assert got is not None, "clone3(CLONE_INTO_CGROUP) fell back on a cgroup2 directory"
    _, text = got
    assert _cgroup2_line(text) == f"/{scratch_slice.name}/born-here"
    assert (
        _cgroup2_line(Path("/proc/self/cgroup").read_text()) != f"/{scratch_slice.name}/born-here"
    )


def test_a_directory_that_is_not_a_cgroup_falls_back_for_that_call_only(
    target: int, tmp_path: Path
) -> None:
    plain = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        assert clone.clone_into(plain) is None  # EBADF from the kernel
    finally:
        os.close(plain)
    assert clone._STATE.unsupported is False
    assert _cat_self_cgroup_from(target) is not None  # the next clone into a cgroup still works
