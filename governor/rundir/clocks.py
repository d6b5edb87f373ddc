"""The board's clock ledger: ``/run/governor/clocks.json``, one entry per clock device a policy
set ([clocks]), so that whoever comes last can restore it exactly: the supervisor at its end,
the watchdog after a crash, ``governor remove``, or the next launch finding only dead holders.

Each entry: the device (key, kind, name, path), the writes asked for (``request``), the
originals saved before each write in write order (``saved``), and the holders (policy, pid:
None for `governor apply`, held until `governor remove`; source). Every read-modify-write
happens under an flock of ``.clocks.lock`` beside it; the file is replaced atomically. Standard
library only (the watchdog's restore runs it after the governor died).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LEDGER_FILE = "clocks.json"
LOCK_FILE = ".clocks.lock"
FORMAT = 1


class Ledger:
    """Read and replace the ledger under its lock: ``with ledger.locked() as entries: ...``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.path = directory / LEDGER_FILE

    def read(self) -> dict[str, dict[str, Any]]:
        """The entries by device path, without the lock (status, diff): {} when none."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        devices = data.get("devices") if isinstance(data, dict) else None
        return devices if isinstance(devices, dict) else {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, dict[str, Any]]]:
        """The entries, to change in place; written back when the block ends, even when it
        raises (what was written to the board before the error is recorded)."""
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self.read()
            try:
                yield entries
            finally:
                self._write(entries)
        finally:
            os.close(fd)

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        if not entries:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return
        tmp = self.dir / f".{LEDGER_FILE}.{os.getpid()}"
        data = json.dumps({"format": FORMAT, "devices": entries}, indent=1).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


def held_by(entries: dict[str, dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    """The entries ``policy`` holds (status, diff)."""
    return [
        e for e in entries.values() if any(h.get("policy") == policy for h in e.get("holders", []))
    ]
