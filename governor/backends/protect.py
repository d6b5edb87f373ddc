"""memory.min/low of the slices above a policy's group: each governor-made ancestor holds the
sum of its children's, because a cgroup's effective protection is capped by its parent's
(mm/memcontrol.c, mem_cgroup_calculate_protection): a group's memory.min under a slice with
memory.min 0 protects nothing.

Two launches in one slice both read-modify-write the slice's value: each does it holding an
exclusive flock on the slice's directory, so neither sum is computed from a stale read.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from governor.errors import BackendError
from governor.kernel.cgroupfs import CgroupFs
from governor.log import get_logger

log = get_logger("governor.backends.cgroupfs")


def protection(text: str) -> int | None:
    """memory.min/low as bytes; None for "max"."""
    return None if text == "max" else int(text)


def at_least(a: int | None, b: int | None) -> bool:
    """a >= b where None is "max"."""
    return a is None or (b is not None and a >= b)


def children_protection(fs: CgroupFs, parent: str, file: str) -> int | None:
    """Sum of the children's ``file`` (None: a child asks for "max")."""
    total = 0
    for child in fs.children(parent):
        try:
            value = protection(fs.read(child, file).strip())
        except BackendError as err:
            if err.errno == errno.ENOENT:  # no memory controller there, or gone meanwhile
                continue
            raise
        if value is None:
            return None
        total += value
    return total


@contextmanager
def locked(fs: CgroupFs, cgroup: str) -> Iterator[None]:
    """An exclusive flock on ``cgroup``'s directory for one read-modify-write."""
    fd = fs.open_dir(cgroup)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def protect_parents(
    fs: CgroupFs, parents: Sequence[str], files: Sequence[str], *, raise_only: bool
) -> list[tuple[str, str, str, str]]:
    """Set each parent's ``files`` to the sum of its children's, nearest first; returns
    (cgroup, file, previous, value) per write. ``raise_only`` (apply) never lowers an
    operator's larger value; remove lowers the slices back to what the remaining children need
    and never raises."""
    done: list[tuple[str, str, str, str]] = []
    for file in files:
        for parent in reversed(parents):
            if not fs.exists(parent):
                continue
            with locked(fs, parent):
                need = children_protection(fs, parent, file)
                live = fs.read(parent, file).strip()
                have = protection(live)
                if need == have or (raise_only and at_least(have, need)):
                    continue
                if not raise_only and at_least(need, have):
                    continue  # remove never raises
                value = "max" if need is None else str(need)
                fs.write(parent, file, value)
            done.append((parent, file, live, value))
            log.info("cgroup.protect_parent", cgroup=parent, file=file, value=value, previous=live)
    return done
