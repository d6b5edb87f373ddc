"""The board's clock ledger: ``/run/governor/clocks.json``, one entry per clock device a policy
set ([clocks]), so that whoever comes last can restore it exactly: the supervisor at its end,
the watchdog after a crash, ``governor remove``, or the next launch finding only dead holders.

Each entry: the device (key, kind, name, path), the writes asked for (``request``), the
originals saved before each write in write order (``saved``), and the holders (policy, pid:
None for `governor apply`, held until `governor remove`; source). Every read-modify-write
happens under an flock of ``.clocks.lock`` beside it; the file is replaced atomically. Standard
library only (the watchdog's restore runs it after the governor died).

Another process may have written the file (or a crash, a full disk, a hand): it is read through
one validating reader, :func:`check_entry`. An entry that is not what the governor writes (a
path that is not an absolute, normalised directory under the sysfs root, a file that is not one
of its kind's role files, holders or saved values of the wrong type) is never acted on and never
dropped: it stays as it is, with its problem in :attr:`Ledger.problems`, and a device it names
is refused (71) until an operator repairs it. A file that is not a ledger at all (truncated,
not JSON, not UTF-8) makes :meth:`Ledger.locked` refuse (71) rather than overwrite the record
of the originals.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from governor.atomic import write_atomic
from governor.errors import BackendError
from governor.kernel.clocks import ROLE_FILES
from governor.peer.files import CappedReadError, read_capped
from governor.record import field, fields, record

LEDGER_FILE = "clocks.json"
LOCK_FILE = ".clocks.lock"
LEDGER_MAX = 1 << 20  # a board has a few devfreq devices: an entry each is ~0.3 KiB
FORMAT = 1
_FILES = {kind: frozenset(files.values()) for kind, files in ROLE_FILES.items()}


@record(frozen=True)
class Holder:
    """One holder of a device: ``pid`` None for `governor apply` (held until `governor
    remove`); ``source`` launch, monitor or apply."""

    policy: str
    pid: int | None
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "pid": self.pid, "source": self.source}


@record
class ClockEntry:
    """One device's entry: the writes asked for (``request``, [file, value] pairs), the
    originals saved before each write in write order (``saved``), who holds it, and the
    restore's errors when it failed (the entry then stays, with its holders)."""

    key: str
    kind: str  # cpufreq | devfreq
    name: str
    path: str  # the device directory: the entry's key in the file
    request: list[list[str]]
    saved: list[list[str]] = field(default_factory=list)
    holders: list[Holder] = field(default_factory=list)
    failed: list[str] | None = None

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> ClockEntry:
        """An entry :func:`check_entry` passed (only :meth:`Ledger._load` reads one)."""
        values = {f.name: entry[f.name] for f in fields(cls) if f.name in entry}
        values["holders"] = [
            Holder(h["policy"], h.get("pid"), h["source"]) for h in entry["holders"]
        ]
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "kind": self.kind,
            "name": self.name,
            "path": self.path,
            "request": self.request,
            "saved": self.saved,
            "holders": [h.to_json() for h in self.holders],
        }
        if self.failed is not None:
            out["failed"] = self.failed
        return out

    def holder_names(self) -> str:
        """``chat (pid 12), batch (governor apply)``: for messages and logs."""
        return ", ".join(
            h.policy + (f" (pid {h.pid})" if h.pid else " (governor apply)") for h in self.holders
        )


def _pairs(value: Any, kind: str) -> str | None:
    """A list of [role file, value] pairs of ``kind``'s files, or what is wrong with it."""
    if not isinstance(value, list):
        return "not a list"
    for pair in value:
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        ):
            return f"{pair!r} is not a [file, value] pair"
        if pair[0] not in _FILES[kind]:  # type: ignore[index]  # kind checked first
            return f"{pair[0]!r} is not a {kind} clock file"
    return None


def within(path: str, sysfs_root: str | None) -> bool:
    """Whether ``path`` (a device directory, or a clock file: checked again at each write, a
    symlink may have been put in since the ledger was read) resolves under ``sysfs_root``."""
    if sysfs_root is None:
        return True
    root = os.path.realpath(sysfs_root)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def check_entry(key: Any, entry: Any, sysfs_root: str | None) -> str | None:
    """None when ``entry`` is a ledger entry for the device directory ``key`` as the governor
    writes it (and, with ``sysfs_root``, confined to it); else what is wrong with it."""
    if not isinstance(entry, dict):
        return "not an object"
    if not isinstance(key, str) or not os.path.isabs(key) or os.path.normpath(key) != key:
        return f"device path {key!r} is not absolute and normalised"
    if entry.get("path") != key:
        return f"its path {entry.get('path')!r} is not its key"
    kind = entry.get("kind")
    if not isinstance(kind, str) or kind not in _FILES:
        return f"kind {kind!r} is neither cpufreq nor devfreq"
    for name in ("key", "name"):
        if not isinstance(entry.get(name), str):
            return f"{name} {entry.get(name)!r} is not a string"
    for name in ("request", "saved"):
        problem = _pairs(entry.get(name), kind)
        if problem is not None:
            return f"{name}: {problem}"
    holders = entry.get("holders")
    if not isinstance(holders, list):
        return "holders: not a list"
    for h in holders:
        pid = h.get("pid") if isinstance(h, dict) else None
        if (
            not isinstance(h, dict)
            or not isinstance(h.get("policy"), str)
            or not isinstance(h.get("source"), str)
            or not (pid is None or (type(pid) is int and pid > 0))
        ):
            return f"holder {h!r} is not {{policy, pid, source}}"
    failed = entry.get("failed")
    if failed is not None and not (
        isinstance(failed, list) and failed and all(isinstance(f, str) for f in failed)
    ):
        return f"failed {failed!r} is not a list of messages"
    if not within(key, sysfs_root):
        return f"device path {key} is outside the sysfs root {sysfs_root}"
    return None


class Ledger:
    """Read and replace the ledger under its lock: ``with ledger.locked() as entries: ...``.
    ``sysfs_root``: where every device of a valid entry lives (None: not checked, for readers
    that only show it)."""

    def __init__(self, directory: Path, sysfs_root: str | Path | None = None) -> None:
        self.dir = directory
        self.path = directory / LEDGER_FILE
        self.sysfs_root = None if sysfs_root is None else str(sysfs_root)
        self.invalid: dict[str, Any] = {}  # the entries read but not valid, kept as they were
        self.problems: list[str] = []  # one line per invalid entry (or the whole file)

    def _load(self) -> dict[str, ClockEntry]:
        """The valid entries; the invalid ones in :attr:`invalid`; ValueError for a file that
        is not a ledger at all."""
        self.invalid, self.problems = {}, []
        try:
            raw = read_capped(self.path, LEDGER_MAX, follow=False)
        except FileNotFoundError:
            return {}
        except CappedReadError as err:  # a FIFO, a device, a symlink: not a ledger
            raise ValueError(err.problem) from None
        data = json.loads(raw.decode("utf-8"))  # ValueError (UnicodeDecodeError included)
        devices = data.get("devices") if isinstance(data, dict) else None
        if not isinstance(devices, dict):
            raise ValueError('no "devices" object')
        valid: dict[str, ClockEntry] = {}
        for key, entry in devices.items():
            problem = check_entry(key, entry, self.sysfs_root)
            if problem is None:
                valid[key] = ClockEntry.from_json(entry)
            else:
                self.invalid[key] = entry
                self.problems.append(f"clock ledger entry {key!r}: {problem}")
        return valid

    def read(self) -> dict[str, ClockEntry]:
        """The valid entries by device path, without the lock (status, diff): {} when none or
        when the file cannot be read (:attr:`problems` says why)."""
        try:
            return self._load()
        except OSError as err:
            self.problems = [f"clock ledger {self.path}: {err.strerror}"]
        except ValueError as err:
            self.problems = [f"clock ledger {self.path} is not a ledger: {err}"]
        return {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, ClockEntry]]:
        """The valid entries, to change in place; written back (with the invalid ones as they
        were) when the block ends, even when it raises (what was written to the board before
        the error is recorded). BackendError (71) when the file is not a ledger."""
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                entries = self._load()
            except ValueError as err:
                raise BackendError(
                    f"the clock ledger is not a ledger ({err})",
                    file=str(self.path),
                    hint="it records the originals of the board's clocks: restore them by hand"
                    " (or reboot), then move the file away",
                ) from None
            try:
                yield entries
            finally:
                self._write({**self.invalid, **{k: e.to_json() for k, e in entries.items()}})
        finally:
            os.close(fd)

    def _write(self, entries: dict[str, Any]) -> None:
        if not entries:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return
        data = json.dumps({"format": FORMAT, "devices": entries}, indent=1).encode()
        write_atomic(self.path, data, 0o644, durable=True)
