"""A tmp directory tree that behaves enough like cgroupfs for the backend.

Only the kernel's side effects are faked: what appears in a new child (per the parent's
``cgroup.subtree_control``), what ``+ctrl``/``-ctrl`` does to the children, what ``rmdir`` and
``cgroup.kill`` do. Reads, writes, error translation and the open flags are the production
:class:`CgroupFs` code; a write to a file the kernel would not have fails with ENOENT because
there is no O_CREAT. Kernel-side file updates use :func:`_kset` (plain ``Path.write_text``),
never the production write path, so fault counting sees only what the backend asked for.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from governor.errors import BackendError
from governor.kernel import files
from governor.kernel.cgroupfs import CgroupFs, translate

ROOT_CONTROLLERS = ("cpuset", "cpu", "io", "memory", "pids")
# the order the kernel prints controllers in (subsystem id order, include/linux/cgroup_subsys.h)
KERNEL_ORDER = ("cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc")

_PSI = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"

# interface files and their kernel defaults, per controller (Documentation/admin-guide/cgroup-v2.rst)
CONTROLLER_FILES: dict[str, dict[str, str]] = {
    "memory": {
        files.MEMORY_MIN: "0\n",
        files.MEMORY_LOW: "0\n",
        files.MEMORY_HIGH: "max\n",
        files.MEMORY_MAX: "max\n",
        files.MEMORY_SWAP_MAX: "max\n",
        files.MEMORY_OOM_GROUP: "0\n",
        files.MEMORY_CURRENT: "0\n",
        files.MEMORY_EVENTS: "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
        files.MEMORY_STAT: "anon 0\nfile 0\nfile_mapped 0\nshmem 0\n",
    },
    "cpu": {files.CPU_WEIGHT: "100\n", files.CPU_MAX: "max 100000\n"},
    "cpuset": {
        files.CPUSET_CPUS: "\n",
        files.CPUSET_MEMS: "\n",
        files.CPUSET_CPUS_EFFECTIVE: "0-3\n",
    },
    "io": {files.IO_WEIGHT: "default 100\n"},
    "pids": {files.PIDS_MAX: "max\n", files.PIDS_CURRENT: "0\n"},
}

# files every non-root cgroup has, whatever is enabled (cpu.stat and *.pressure are core files)
CORE_FILES: dict[str, str] = {
    files.CGROUP_PROCS: "",
    files.CGROUP_THREADS: "",
    files.CGROUP_SUBTREE_CONTROL: "\n",
    files.CGROUP_EVENTS: "populated 0\nfrozen 0\n",
    files.CGROUP_FREEZE: "0\n",
    files.CGROUP_KILL: "",
    files.CGROUP_TYPE: "domain\n",
    files.CPU_STAT: "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
    files.MEMORY_PRESSURE: _PSI,
    files.CPU_PRESSURE: _PSI,
    files.IO_PRESSURE: _PSI,
}


def _kset(path: Path, text: str) -> None:
    """The kernel updating its own file (not the code under test)."""
    path.write_text(text)


def _kernel_list(names: Iterable[str]) -> str:
    chosen = set(names)
    return " ".join(c for c in KERNEL_ORDER if c in chosen) + "\n"


def _fail(action: str, code: int, cgroup: str, file: str | None = None) -> BackendError:
    err = OSError(code, os.strerror(code))
    out = translate(err, action, cgroup=cgroup, file=file)
    assert isinstance(out, BackendError)
    return out


def make_root(
    root: Path, controllers: Iterable[str] = ROOT_CONTROLLERS, subtree: Iterable[str] = ()
) -> Path:
    """The root cgroup of a fresh fake hierarchy."""
    root.mkdir(parents=True, exist_ok=True)
    _kset(root / files.CGROUP_CONTROLLERS, _kernel_list(controllers))
    _kset(root / files.CGROUP_SUBTREE_CONTROL, _kernel_list(subtree))
    _kset(root / files.CGROUP_PROCS, "")
    _kset(root / files.CGROUP_EVENTS, "populated 0\nfrozen 0\n")
    _kset(root / files.CPU_STAT, CORE_FILES[files.CPU_STAT])
    return root


class FakeKernelCgroupFs(CgroupFs):
    """CgroupFs over a tmp tree; only mkdir/rmdir/enable/disable/kill add kernel side effects.

    ``has_kill=False`` models a kernel older than 5.14 (no ``cgroup.kill`` in new children).
    """

    def __init__(self, root: Path, *, has_kill: bool = True) -> None:
        super().__init__(root)
        self.has_kill = has_kill
        # each cgroup.kill adds 1 to the cgroup's and every descendant's (kernel/cgroup/cgroup.c
        # __cgroup_kill, 6.14+): what 6.18's CLONE_INTO_CGROUP compares (tests/fakefs/
        # test_launch_restart.py)
        self.kill_seq: dict[str, int] = {}
        # cgroups an exiting process still populates with no pid in cgroup.procs: the kernel
        # hides a dying thread group from cgroup.procs before exit_mm, and unpopulates its
        # cgroup only at cgroup_exit after it (rmdir: EBUSY meanwhile); tear_down ends it
        self.exiting: set[str] = set()

    # --- helpers for tests (the kernel's view) ---------------------------------------------------

    def add_process(self, cgroup: str, pid: int) -> None:
        """Pretend ``pid`` lives in ``cgroup`` (as if moved there)."""
        path = self.path(cgroup) / files.CGROUP_PROCS
        _kset(path, path.read_text() + f"{pid}\n")
        self.refresh_populated()

    def reap(self, pid: int) -> None:
        """The process exited: drop it from every cgroup.procs."""
        for procs in self.root.rglob(files.CGROUP_PROCS):
            keep = [line for line in procs.read_text().split() if line != str(pid)]
            _kset(procs, "".join(f"{p}\n" for p in keep))
        self.refresh_populated()

    def reap_slowly(self, pid: int) -> None:
        """The process is exiting: gone from cgroup.procs, its cgroups populated until
        :meth:`tear_down` (its address space still being freed)."""
        for procs in self.root.rglob(files.CGROUP_PROCS):
            if str(pid) in procs.read_text().split():
                self.exiting.add(str(procs.parent.relative_to(self.root)))
        self.reap(pid)

    def tear_down(self) -> None:
        """Every exiting process's cgroup_exit: their cgroups unpopulated."""
        self.exiting.clear()
        self.refresh_populated()

    def refresh_populated(self) -> None:
        """``populated`` is 1 where the subtree has a process (cgroup.events, not in the root)."""
        for events in self.root.rglob(files.CGROUP_EVENTS):
            directory = events.parent
            if directory == self.root:
                continue
            name = str(directory.relative_to(self.root))
            busy = any(p.read_text().strip() for p in directory.rglob(files.CGROUP_PROCS)) or any(
                e == name or e.startswith(name + "/") for e in self.exiting
            )
            frozen = self.events(name).get("frozen", 0)
            _kset(events, f"populated {int(busy)}\nfrozen {frozen}\n")

    def _parent(self, cgroup: str) -> str:
        return cgroup.rpartition("/")[0]

    def _add_controller_files(self, cgroup: str, controllers: Iterable[str]) -> None:
        path = self.path(cgroup)
        for controller in controllers:
            for name, default in CONTROLLER_FILES.get(controller, {}).items():
                if not (path / name).exists():
                    _kset(path / name, default)

    def _drop_controller_files(self, cgroup: str, controllers: Iterable[str]) -> None:
        path = self.path(cgroup)
        for controller in controllers:
            for name in CONTROLLER_FILES.get(controller, {}):
                (path / name).unlink(missing_ok=True)

    # --- kernel side effects -----------------------------------------------------------------

    def mkdir(self, cgroup: str) -> bool:
        created = super().mkdir(cgroup)
        if created:
            path = self.path(cgroup)
            for name, default in CORE_FILES.items():
                if name == files.CGROUP_KILL and not self.has_kill:
                    continue
                _kset(path / name, default)
            parent_subtree = self.subtree_control(self._parent(cgroup))
            _kset(path / files.CGROUP_CONTROLLERS, _kernel_list(parent_subtree))
            self._add_controller_files(cgroup, parent_subtree)
        return created

    def rmdir(self, cgroup: str) -> None:
        path = self.path(cgroup)
        if path.is_dir() and cgroup:
            if self.children(cgroup) or self.procs(cgroup) or self.events(cgroup)["populated"]:
                # the kernel refuses to remove a populated cgroup or one with children
                raise _fail("cannot remove cgroup", errno.EBUSY, cgroup)
            for entry in path.iterdir():
                entry.unlink()  # interface files vanish with the directory on cgroupfs
        super().rmdir(cgroup)

    def enable(self, cgroup: str, controllers: Iterable[str]) -> None:
        names = list(controllers)
        available = self.controllers(cgroup)
        for name in names:
            if name not in available:
                raise _fail(
                    "cannot write cgroup file", errno.ENOENT, cgroup, files.CGROUP_SUBTREE_CONTROL
                )
        if cgroup and self.procs(cgroup):
            # "no internal processes" (cgroup-v2.rst)
            raise _fail(
                "cannot write cgroup file", errno.EBUSY, cgroup, files.CGROUP_SUBTREE_CONTROL
            )
        before = self.subtree_control(cgroup)
        super().enable(cgroup, names)  # the production write: "+a +b", no O_CREAT
        after = before | set(names)
        _kset(self.path(cgroup) / files.CGROUP_SUBTREE_CONTROL, _kernel_list(after))
        for child in self.children(cgroup):
            _kset(self.path(child) / files.CGROUP_CONTROLLERS, _kernel_list(after))
            self._add_controller_files(child, after)

    def disable(self, cgroup: str, controllers: Iterable[str]) -> None:
        names = list(controllers)
        for child in self.children(cgroup):
            if self.subtree_control(child) & set(names):
                # strict (pre-4.6-style) check: a child still enabling it for its own children
                raise _fail(
                    "cannot write cgroup file", errno.EBUSY, cgroup, files.CGROUP_SUBTREE_CONTROL
                )
        before = self.subtree_control(cgroup)
        super().disable(cgroup, names)
        after = before - set(names)
        _kset(self.path(cgroup) / files.CGROUP_SUBTREE_CONTROL, _kernel_list(after))
        for child in self.children(cgroup):
            _kset(self.path(child) / files.CGROUP_CONTROLLERS, _kernel_list(after))
            self._drop_controller_files(child, set(names))

    def kill(self, cgroup: str) -> None:
        super().kill(cgroup)  # the production write; ENOENT without cgroup.kill
        for events in self.path(cgroup).rglob(files.CGROUP_EVENTS):
            name = str(events.parent.relative_to(self.root))
            self.kill_seq[name] = self.kill_seq.get(name, 0) + 1
        for procs in self.path(cgroup).rglob(files.CGROUP_PROCS):
            _kset(procs, "")
        self.refresh_populated()


class FaultyFs(FakeKernelCgroupFs):
    """Fails the ``n``-th (0-based) call of ``op`` ("mkdir" | "enable" | "write") once.

    Only calls made by the code under test count: a write made inside ``enable`` is part of
    the enable. The raised error goes through the production ``translate`` and is kept in
    ``self.injected`` so a test can check that exactly this object propagates.
    """

    def __init__(
        self,
        root: Path,
        *,
        op: str | None = None,
        n: int = 0,
        code: int = errno.EINVAL,
        has_kill: bool = True,
    ) -> None:
        super().__init__(root, has_kill=has_kill)
        self.op = op
        self.n = n
        self.code = code
        self.calls: list[tuple[str, str, str | None]] = []
        self.injected: Exception | None = None
        self._depth = 0

    def _step(self, op: str, cgroup: str, file: str | None, value: str | None) -> None:
        if self._depth:
            return
        index = sum(1 for c in self.calls if c[0] == op)
        self.calls.append((op, cgroup, file))
        if self.injected is None and op == self.op and index == self.n:
            err = OSError(self.code, os.strerror(self.code))
            action = "cannot create cgroup" if op == "mkdir" else "cannot write cgroup file"
            self.injected = translate(err, action, cgroup=cgroup, file=file, value=value)
            raise self.injected from err

    def mkdir(self, cgroup: str) -> bool:
        self._step("mkdir", cgroup, None, None)
        self._depth += 1
        try:
            return super().mkdir(cgroup)
        finally:
            self._depth -= 1

    def enable(self, cgroup: str, controllers: Iterable[str]) -> None:
        names = list(controllers)
        value = " ".join(f"+{c}" for c in names)
        self._step("enable", cgroup, files.CGROUP_SUBTREE_CONTROL, value)
        self._depth += 1
        try:
            super().enable(cgroup, names)
        finally:
            self._depth -= 1

    def write(self, cgroup: str, file: str, value: str) -> None:
        self._step("write", cgroup, file, value)
        super().write(cgroup, file, value)
