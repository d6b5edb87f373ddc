"""The change journal of one governed slice: ``/run/governor/<name>/journal.jsonl``.

Every change to a live limit is one JSON line, appended (O_APPEND, one write): a `tune`, a
`rollback`, or a monitor action that set a limit. Each entry has an ``id`` (1, 2, ...), the
wall-clock ``time``, its ``source`` and the ``changes`` made: ``cgroup``, ``file``, ``before``
and ``after`` as the kernel reads them. `rollback` restores ``before`` values in reverse order;
the running monitor asks :meth:`Journal.tuned` for the operator's latest value of a file so
that its own actions never undo a tune. Standard library only (the run time uses it).

A tune made with ``--confirm DURATION`` carries ``confirm_by`` (epoch seconds) and the pid of
its detached reverter (``reverter_pid``, governor/operate/confirm.py); a later ``confirm`` entry
(``confirms: [ids]``, no changes) keeps it, a ``rollback`` entry (``reason: "not confirmed"``)
undoes it. :meth:`Journal.pending` lists the tunes still waiting. Decisions that read then write
(confirm, the reverter's revert) hold :meth:`Journal.locked`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "journal.lock"
CHANGING = ("tune", "rollback", "monitor")  # the sources whose entries change a limit


class Journal:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.path = directory / JOURNAL_FILE

    def entries(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        try:
            text = self.path.read_text()
        except OSError:
            return out
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and "id" in entry:
                    out.append(entry)
        return out

    def append(self, source: str, changes: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """One entry for ``changes``; returns it (with its id)."""
        entries = self.entries()
        entry = {
            "id": (entries[-1]["id"] + 1) if entries else 1,
            "time": round(time.time(), 3),
            "source": source,
            "changes": changes,
            **extra,
        }
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())
        finally:
            os.close(fd)
        return entry

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive lock on the journal (flock), for read-decide-write sequences."""
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def confirmed(self) -> set[int]:
        return {
            i for e in self.entries() if e["source"] == "confirm" for i in e.get("confirms", ())
        }

    def pending(self) -> list[dict[str, Any]]:
        """Tunes made with --confirm that are neither confirmed nor undone yet."""
        done = self.undone() | self.confirmed()
        return [
            e
            for e in self.entries()
            if e["source"] == "tune" and e.get("confirm_by") is not None and e["id"] not in done
        ]

    def undone(self) -> set[int]:
        return {i for e in self.entries() if e["source"] == "rollback" for i in e.get("undoes", ())}

    def tuned(self, file: str) -> str | None:
        """The operator's value for ``file``: the ``after`` of the latest tune (or rollback)
        that touched it and was not undone; None when the operator never tuned it."""
        undone = self.undone()
        for entry in reversed(self.entries()):
            if entry["source"] not in ("tune", "rollback") or entry["id"] in undone:
                continue
            for change in reversed(entry["changes"]):
                if change["file"] == file:
                    return str(change["after"])
        return None

    def tail(self, n: int = 5) -> list[dict[str, Any]]:
        return self.entries()[-n:]
