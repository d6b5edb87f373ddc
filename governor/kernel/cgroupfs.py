"""The one door to the cgroup v2 filesystem: every open, mkdir and rmdir under the root is here.

The root is injected (``CgroupFs(Path("/sys/fs/cgroup"))`` in production, a tmp tree in tests);
there is no global and no test mode. Cgroup arguments are paths relative to the root
(``""`` is the root itself, ``"governor.slice/npu-chat"`` a descendant).

Files are written the way opencontainers/cgroups ``file.go`` writes them: ``O_WRONLY | O_TRUNC |
O_CLOEXEC``, never ``O_CREAT`` (a missing interface file is an error, not a new regular file),
and the whole value in one ``write(2)`` because cgroupfs parses each write on its own.

Every ``OSError`` is translated here, once, into :class:`~governor.errors.PermissionDenied`
(EACCES/EPERM) or :class:`~governor.errors.BackendError` carrying cgroup, file, value and errno.
Readers are thin wrappers around the pure parsers in :mod:`governor.kernel.parse`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from governor.errors import BackendError, PermissionDenied
from governor.kernel import files
from governor.kernel.parse import Psi, parse_controllers, parse_flat_keyed, parse_max, parse_psi

PsiResource = Literal["memory", "cpu", "io"]

_WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# cgroupfs files are small; memory.stat is the largest at a few KiB (kernfs seq_file pages)
_READ_CHUNK = 65536


def _hint(err: OSError, file: str | None) -> str | None:
    """The kernel's usual reason for an errno on a given file (cgroup-v2.rst)."""
    code = err.errno
    if file == files.CGROUP_SUBTREE_CONTROL and code == errno.EBUSY:
        # "no internal processes" rule: a non-root cgroup with processes cannot enable
        # domain controllers for its children
        return "no internal processes: the cgroup has processes of its own"
    if file == files.CGROUP_SUBTREE_CONTROL and code == errno.ENOENT:
        return "controller not available: it is not in this cgroup's cgroup.controllers"
    if file in (files.CPUSET_CPUS, files.CPUSET_MEMS) and code == errno.EINVAL:
        return "CPU not in parent's cpuset.cpus.effective"
    if file in (files.CPUSET_CPUS, files.CPUSET_MEMS) and code == errno.ERANGE:
        # cpulist_parse() rejects numbers at or above nr_cpu_ids before the subset check
        return "no such CPU on this host (beyond the possible CPUs)"
    if file == files.CGROUP_KILL and code == errno.ENOENT:
        return "cgroup.kill needs Linux 5.14 or newer"
    if file is not None and code == errno.ENOENT and files.controller_of(file) is not None:
        return "controller not enabled in parent's cgroup.subtree_control"
    if file is None and code == errno.EBUSY:
        return "the cgroup still has processes or child cgroups"
    if code in (errno.EACCES, errno.EPERM):
        return "run as root or in a delegated cgroup (write access to the directory and files)"
    return None


def translate(
    err: OSError,
    action: str,
    *,
    cgroup: str,
    file: str | None = None,
    value: str | None = None,
) -> BackendError | PermissionDenied:
    """The governor error for ``err``; callers ``raise translate(...) from err``."""
    code = err.errno
    cls = PermissionDenied if code in (errno.EACCES, errno.EPERM) else BackendError
    return cls(action, cgroup=cgroup, file=file, value=value, errno=code, hint=_hint(err, file))


class CgroupFs:
    """Reads and writes cgroup v2 interface files below an injected root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"CgroupFs({str(self.root)!r})"

    # --- paths ---------------------------------------------------------------------------------

    def path(self, cgroup: str) -> Path:
        """The directory of ``cgroup``; ValueError for anything but a clean relative path."""
        if not isinstance(cgroup, str):
            raise ValueError(f"cgroup must be a str, got {type(cgroup).__name__}")
        if cgroup == "":
            return self.root
        if cgroup.startswith("/"):
            raise ValueError(f"cgroup must be relative to the cgroup root, got {cgroup!r}")
        parts = cgroup.split("/")
        for part in parts:
            if part in ("", ".", ".."):
                raise ValueError(f"cgroup has an empty, '.' or '..' component: {cgroup!r}")
            if "\0" in part:
                raise ValueError(f"cgroup contains a NUL byte: {cgroup!r}")
        return self.root.joinpath(*parts)

    def _file(self, cgroup: str, file: str) -> Path:
        if not file or "/" in file or "\0" in file or file in (".", ".."):
            raise ValueError(f"not a cgroup interface file name: {file!r}")
        return self.path(cgroup) / file

    def exists(self, cgroup: str) -> bool:
        return self.path(cgroup).is_dir()

    # --- raw access ----------------------------------------------------------------------------

    def read(self, cgroup: str, file: str) -> str:
        """The whole file as text (newline kept)."""
        path = self._file(cgroup, file)
        try:
            fd = os.open(path, _READ_FLAGS)
            try:
                chunks: list[bytes] = []
                while chunk := os.read(fd, _READ_CHUNK):
                    chunks.append(chunk)
            finally:
                os.close(fd)
        except OSError as err:
            raise translate(err, "cannot read cgroup file", cgroup=cgroup, file=file) from err
        return b"".join(chunks).decode()

    def write(self, cgroup: str, file: str, value: str) -> None:
        """Write ``value`` with one ``write(2)``; the file must exist (no O_CREAT)."""
        path = self._file(cgroup, file)
        data = value.encode()
        try:
            fd = os.open(path, _WRITE_FLAGS)
            try:
                written = os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as err:
            raise translate(
                err, "cannot write cgroup file", cgroup=cgroup, file=file, value=value
            ) from err
        if written != len(data):
            # kernfs takes a write whole or fails it; a short count means the value was cut
            raise BackendError(
                f"short write to cgroup file ({written} of {len(data)} bytes)",
                cgroup=cgroup,
                file=file,
                value=value,
            )

    def mkdir(self, cgroup: str) -> bool:
        """Create ``cgroup`` (its parent must exist); True if created, False if it existed."""
        path = self.path(cgroup)
        if cgroup == "":
            return False
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            return False
        except OSError as err:
            raise translate(err, "cannot create cgroup", cgroup=cgroup) from err
        return True

    def rmdir(self, cgroup: str) -> None:
        """Remove an empty cgroup (no processes, no children); interface files go with it."""
        if cgroup == "":
            raise ValueError("refusing to remove the cgroup root")
        try:
            os.rmdir(self.path(cgroup))
        except OSError as err:
            raise translate(err, "cannot remove cgroup", cgroup=cgroup) from err

    def children(self, cgroup: str) -> list[str]:
        """Child cgroups as paths relative to the root, sorted."""
        base = self.path(cgroup)
        try:
            with os.scandir(base) as entries:
                names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except OSError as err:
            raise translate(err, "cannot list cgroup", cgroup=cgroup) from err
        return [f"{cgroup}/{name}" if cgroup else name for name in names]

    def subtree(self, cgroup: str, *, strict: bool = True) -> list[str]:
        """THE walk: ``cgroup`` and its descendants, parents first, siblings sorted. One that
        vanished meanwhile (ENOENT) has no children; any other error passes, unless not
        ``strict``: then a cgroup that cannot be listed has none either."""
        out: list[str] = []
        todo = [cgroup]
        while todo:
            cg = todo.pop()
            out.append(cg)
            try:
                children = self.children(cg)
            except (BackendError, PermissionDenied) as err:
                if strict and err.errno != errno.ENOENT:
                    raise
                children = []
            todo += reversed(children)
        return out

    def read_limit(self, cgroup: str, file: str, *, unreadable: int | None = None) -> int | None:
        """THE guarded read of a limit or counter (memory.max, memory.current, ...): its value,
        None for ``max``, and ``unreadable`` when the file (or the group) cannot be read or
        holds no number (a group that went away meanwhile is no error to a reader of limits)."""
        try:
            return parse_max(self.read(cgroup, file))
        except (BackendError, PermissionDenied, ValueError):
            return unreadable

    def procs_below(self, cgroup: str, *, strict: bool = False) -> list[int]:
        """Every pid in ``cgroup`` and its descendants (:meth:`subtree`'s order); a cgroup that
        vanishes meanwhile (or was never there) adds none, nor (unless ``strict``) one that
        cannot be read."""
        out: list[int] = []
        for cg in self.subtree(cgroup, strict=strict):
            try:
                out += self.procs(cg)
            except (BackendError, PermissionDenied) as err:
                if strict and err.errno != errno.ENOENT:
                    raise
        return out

    def open_dir(self, cgroup: str) -> int:
        """An ``O_RDONLY | O_DIRECTORY`` fd of the cgroup (clone3 CLONE_INTO_CGROUP, flock).

        The caller owns the fd and closes it.
        """
        try:
            return os.open(self.path(cgroup), _DIR_FLAGS)
        except OSError as err:
            raise translate(err, "cannot open cgroup directory", cgroup=cgroup) from err

    def open_watch(self, cgroup: str, file: str) -> int:
        """An ``O_RDONLY`` fd to poll for POLLPRI: kernfs notifies file-modified events on
        memory.events and cgroup.events (cgroup-v2.rst). The caller owns the fd."""
        try:
            return os.open(self._file(cgroup, file), _READ_FLAGS | os.O_NONBLOCK)
        except OSError as err:
            raise translate(err, "cannot open cgroup file", cgroup=cgroup, file=file) from err

    def open_trigger(self, cgroup: str, file: str, text: str) -> int:
        """A PSI trigger fd: ``<file>`` opened O_RDWR|O_NONBLOCK with ``text`` ("some 150000
        2000000") written once; poll it for POLLPRI (accounting/psi.rst). One trigger per fd.
        The errno (EINVAL: window refused, e.g. not a 2 s multiple without CAP_SYS_RESOURCE)
        is kept on the raised error. The caller owns the fd."""
        try:
            fd = os.open(self._file(cgroup, file), os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            raise translate(err, "cannot open PSI file", cgroup=cgroup, file=file) from err
        try:
            os.write(fd, text.encode() + b"\0")
        except OSError as err:
            os.close(fd)
            raise translate(
                err, "cannot arm PSI trigger", cgroup=cgroup, file=file, value=text
            ) from err
        return fd

    def open_reset(self, cgroup: str, file: str, text: str) -> int:
        """An ``O_RDWR`` fd on ``file`` with ``text`` written through it: memory.peak's reset
        (6.12) holds for reads through that fd only, so the caller keeps it and reads with
        pread. The errno (EACCES on the read-only memory.peak before 6.12) is kept on the
        raised error. The caller owns the fd."""
        try:
            fd = os.open(self._file(cgroup, file), os.O_RDWR | os.O_CLOEXEC)
        except OSError as err:
            raise translate(err, "cannot open cgroup file", cgroup=cgroup, file=file) from err
        try:
            os.write(fd, text.encode())
        except OSError as err:
            os.close(fd)
            raise translate(
                err, "cannot write cgroup file", cgroup=cgroup, file=file, value=text
            ) from err
        return fd

    # --- parsed readers ------------------------------------------------------------------------

    def _parsed_error(self, err: ValueError, cgroup: str, file: str) -> BackendError:
        return BackendError(f"unexpected content in cgroup file: {err}", cgroup=cgroup, file=file)

    def _keyed(self, cgroup: str, file: str) -> dict[str, int]:
        text = self.read(cgroup, file)
        try:
            return parse_flat_keyed(text)
        except ValueError as err:
            raise self._parsed_error(err, cgroup, file) from err

    def _controller_set(self, cgroup: str, file: str) -> frozenset[str]:
        text = self.read(cgroup, file)
        try:
            return parse_controllers(text)
        except ValueError as err:
            raise self._parsed_error(err, cgroup, file) from err

    def procs(self, cgroup: str) -> list[int]:
        """PIDs in ``cgroup.procs`` (this cgroup only, not descendants)."""
        text = self.read(cgroup, files.CGROUP_PROCS)
        try:
            return [int(line) for line in text.split()]
        except ValueError as err:
            raise self._parsed_error(err, cgroup, files.CGROUP_PROCS) from err

    def controllers(self, cgroup: str) -> frozenset[str]:
        """``cgroup.controllers``: what this cgroup may enable for its children."""
        return self._controller_set(cgroup, files.CGROUP_CONTROLLERS)

    def subtree_control(self, cgroup: str) -> frozenset[str]:
        """``cgroup.subtree_control``: what is enabled for this cgroup's children."""
        return self._controller_set(cgroup, files.CGROUP_SUBTREE_CONTROL)

    def events(self, cgroup: str) -> dict[str, int]:
        """``cgroup.events``: ``populated`` and ``frozen``."""
        return self._keyed(cgroup, files.CGROUP_EVENTS)

    def populated(self, cgroup: str) -> bool:
        """A process lives in ``cgroup`` or below, by ``cgroup.events``: an exiting one too
        until its memory is freed (it leaves cgroup.procs before exit_mm, the cgroup is
        unpopulated at cgroup_exit after it). Raises as :meth:`events` does."""
        return self.events(cgroup).get("populated", 0) != 0

    def memory_events(self, cgroup: str) -> dict[str, int]:
        return self._keyed(cgroup, files.MEMORY_EVENTS)

    def memory_stat(self, cgroup: str) -> dict[str, int]:
        return self._keyed(cgroup, files.MEMORY_STAT)

    def cpu_stat(self, cgroup: str) -> dict[str, int]:
        return self._keyed(cgroup, files.CPU_STAT)

    def read_psi(self, cgroup: str, resource: PsiResource) -> Psi:
        file = f"{resource}.pressure"
        text = self.read(cgroup, file)
        try:
            return parse_psi(text)
        except ValueError as err:
            raise self._parsed_error(err, cgroup, file) from err

    # --- writers with kernel meaning -----------------------------------------------------------

    def move(self, pid: int, cgroup: str) -> None:
        """Move a whole process (all its threads) into ``cgroup``."""
        self.write(cgroup, files.CGROUP_PROCS, str(pid))

    def enable(self, cgroup: str, controllers: Iterable[str]) -> None:
        """Add controllers to ``cgroup.subtree_control`` (one write: ``"+a +b"``)."""
        names = list(controllers)
        if names:
            self.write(cgroup, files.CGROUP_SUBTREE_CONTROL, " ".join(f"+{c}" for c in names))

    def disable(self, cgroup: str, controllers: Iterable[str]) -> None:
        """Remove controllers from ``cgroup.subtree_control`` (one write: ``"-a -b"``)."""
        names = list(controllers)
        if names:
            self.write(cgroup, files.CGROUP_SUBTREE_CONTROL, " ".join(f"-{c}" for c in names))

    def kill(self, cgroup: str) -> None:
        """SIGKILL every process in the subtree, race-free against forks (5.14+)."""
        self.write(cgroup, files.CGROUP_KILL, "1")

    def freeze(self, cgroup: str, on: bool) -> None:
        """Freeze or thaw the subtree; ``cgroup.events`` says ``frozen 1`` once done (5.2+)."""
        self.write(cgroup, files.CGROUP_FREEZE, "1" if on else "0")
