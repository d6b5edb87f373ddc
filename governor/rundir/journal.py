"""The change journal of one governed slice: ``/run/governor/<name>/journal.jsonl``.

Every change to a live limit is one JSON line, appended (O_APPEND, one write): a `tune`, a
`rollback`, or a monitor action that set a limit. Each entry has an ``id`` (1, 2, ...), the
wall-clock ``time``, its ``source`` and the ``changes`` made: ``cgroup``, ``file``, ``before``
and ``after`` as the kernel reads them. `rollback` restores ``before`` values in reverse order;
the running monitor asks :meth:`Journal.tuned` for the operator's latest value of a file so
that its own actions never undo a tune. Standard library and shared records only (run time).

A tune made with ``--confirm DURATION`` carries ``confirm_by`` (epoch seconds) and the pid of
its detached reverter (``reverter_pid``, governor/operate/confirm.py); a later ``confirm`` entry
(``confirms: [ids]``, no changes) keeps it, a ``rollback`` entry (``reason: "not confirmed"``)
undoes it. :meth:`Journal.pending` lists the tunes still waiting. Decisions that read then write
(confirm, the reverter's revert) hold :meth:`Journal.locked`.

A higher QoS class's `shed` (governor/monitor/actions/shedder.py) journals each step it takes on this slice
and each undo: ``source: "shed"``, ``by`` (the shedding policy), ``pid`` (its governor), ``step``
(throttle, freeze, stop, kill; thaw, raise, release), ``when`` (the rule). :meth:`Journal.shed`
folds them into what holds now: the slice's own monitor takes it as its baseline (it never
raises memory.high above a throttle, never thaws a shed freeze) until the shed is released, or
until its shedder's pid is gone (its watchdog reverted the kernel's values).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from governor.peer.files import CappedReadError, read_tail
from governor.plan.model import ShedStep
from governor.record import field, record
from governor.rundir.liveness import own_start, started

JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "journal.lock"
# what a read takes of the journal, its newest end: ~200k entries (a rule that sets a limit
# firing every 2 s for 4 days); the file itself grows unbounded
JOURNAL_MAX = 64 << 20
CHANGING = ("tune", "rollback", "monitor")  # the sources whose entries change a limit
SHED_HOLDS = {
    ShedStep.THROTTLE: "throttled",
    ShedStep.FREEZE: "frozen",
    ShedStep.STOP: "stopped",
    ShedStep.KILL: "killed",
}


@record
class Hold:
    """What a shed holds on one victim: the shedder's own account of a victim
    (governor/monitor/actions/shedder.py) and what the victim's journal folds to
    (:meth:`Journal.shed`: its own monitor's baseline, `governor status`) are this one record.

    ``steps``: the ladder's steps taken and not undone; ``frozen``; ``memory_high``: the
    throttle's value as the journal last saw it (raised by the undo's steps)."""

    by: str | None = None  # the shedding policy
    pid: int | None = None  # its governor
    pid_start: int | None = None  # its governor's start time (rundir/liveness.py: a reused pid)
    since: float | None = None  # its first step (epoch seconds)
    when: str | None = None  # the rule
    frozen: bool = False
    memory_high: str | None = None
    steps: list[ShedStep] = field(default_factory=list)
    unloads: int = 0  # a router's idle models the shed unloaded (nothing held: they reload)

    def took(self, step: Any, changes: Any = ()) -> None:
        """One journaled step (or undo step) and its changes."""
        if step in SHED_HOLDS and step not in self.steps:
            self.steps.append(ShedStep(step))
        if step == ShedStep.UNLOAD:
            self.unloads += 1
        elif step == ShedStep.FREEZE:
            self.frozen = True
        elif step in (ShedStep.THAW, ShedStep.STOP):
            self.frozen = False
        for change in changes:
            if change.get("file") == "memory.high":
                self.memory_high = str(change.get("after"))

    @property
    def state(self) -> str:
        """throttled, frozen, stopped or killed: the strongest step that holds; "unloaded"
        when the shed only unloaded idle models of a router (nothing else was taken)."""
        if self.unloads and not self.steps and not self.frozen and self.memory_high is None:
            return "unloaded"
        return next(
            (SHED_HOLDS[s] for s in (ShedStep.KILL, ShedStep.STOP) if s in self.steps),
            "frozen" if self.frozen else "throttled",
        )

    def as_dict(self) -> dict[str, Any]:
        """As `governor status --json` shows it."""
        return {
            "by": self.by, "pid": self.pid, "since": self.since, "frozen": self.frozen,
            "memory_high": self.memory_high, "when": self.when, "state": self.state,
        }  # fmt: skip


def _int(v: Any) -> bool:
    return type(v) is int


def is_number(v: Any) -> bool:
    """A number a governor writes in its run-dir files (a time, a count, a size): an int in
    64 bits or a finite float; json reads an int of any length, which no float holds."""
    return (type(v) is int and abs(v) < 2**63) or (type(v) is float and math.isfinite(v))


def _value(v: Any) -> bool:  # a file's value as the kernel reads it (None: the file was missing)
    return v is None or isinstance(v, str) or is_number(v)


def _cgroup(v: Any) -> bool:  # relative to the cgroup root, no ., .. or empty component
    return (
        isinstance(v, str) and "\0" not in v and all(p not in ("", ".", "..") for p in v.split("/"))
    )


def _file(v: Any) -> bool:  # a kernel file's bare name (rollback writes it back)
    return isinstance(v, str) and v not in ("", ".", "..") and "/" not in v and "\0" not in v


def _ids(v: Any) -> bool:
    return isinstance(v, list) and all(_int(i) for i in v)


_OPTIONAL: dict[str, Callable[[Any], bool]] = {
    "confirms": _ids,
    "undoes": _ids,
    "confirm_by": lambda v: v is None or is_number(v),
    "reverter_pid": lambda v: v is None or (_int(v) and v > 0),
    "pid": lambda v: v is None or (_int(v) and v > 0),
    "pid_start": lambda v: v is None or (_int(v) and v >= 0),
    "by": lambda v: v is None or isinstance(v, str),
    "step": lambda v: v is None or isinstance(v, str),
    "when": lambda v: v is None or isinstance(v, str),
    "model": lambda v: v is None or isinstance(v, str),  # an unload's (supervise/evict.py)
}


def check_entry(entry: Any) -> str | None:
    """None when ``entry`` is a journal entry as :meth:`Journal.append` writes it; else what is
    wrong with it (THE check every reader of the journal goes through)."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    if not (_int(entry.get("id")) and entry["id"] > 0):
        return f"id {entry.get('id')!r} is not a positive integer"
    if not is_number(entry.get("time")):
        return f"time {entry.get('time')!r} is not a number"
    if not isinstance(entry.get("source"), str):
        return f"source {entry.get('source')!r} is not a string"
    changes = entry.get("changes")
    if not isinstance(changes, list):
        return "changes is not a list"
    for ch in changes:
        if not (
            isinstance(ch, dict)
            and _cgroup(ch.get("cgroup"))
            and _file(ch.get("file"))
            and _value(ch.get("before"))
            and _value(ch.get("after"))
        ):
            return f"change {str(ch)[:60]!r} is not {{cgroup, file, before, after}}"
    for key, check in _OPTIONAL.items():
        if key in entry and not check(entry[key]):
            return f"{key} {str(entry[key])[:40]!r} is not what a governor writes"
    return None


class Journal:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.path = directory / JOURNAL_FILE
        self.problems: list[str] = []  # the lines the last read skipped, and why

    def entries(self) -> list[dict[str, Any]]:
        """THE reader of the journal: every valid entry in order; a line that is not one
        (truncated, not JSON, not UTF-8, wrong types: :func:`check_entry`) is skipped with its
        problem in :attr:`problems`, never hiding the others."""
        out: list[dict[str, Any]] = []
        problems: list[str] = []
        try:
            raw, skipped = read_tail(self.path, JOURNAL_MAX, follow=False)
        except OSError as err:  # none yet; or a FIFO, a device, a symlink
            self.problems = [str(err)] if isinstance(err, CappedReadError) else problems
            return out
        if skipped:
            problems.append(
                f"{self.path}: its oldest {skipped} bytes not read (over {JOURNAL_MAX} bytes:"
                " the newest entries are)"
            )
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError:
                problems.append(f"{self.path}:{n}: not UTF-8")
                continue
            except ValueError:
                problems.append(f"{self.path}:{n}: not JSON")
                continue
            problem = check_entry(entry)
            if problem is not None:
                problems.append(f"{self.path}:{n}: {problem}")
                continue
            out.append(entry)
        self.problems = problems
        return out

    def append(self, source: str, changes: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """One entry for ``changes``; returns it (with its id). An entry this process writes
        under its own ``pid`` (a shed's step) records its start time too (``pid_start``,
        rundir/liveness.py): a reused pid is not its writer."""
        if extra.get("pid") == os.getpid() and "pid_start" not in extra:
            extra["pid_start"] = own_start()
        entries = self.entries()
        entry = {
            "id": max((e["id"] for e in entries), default=0) + 1,
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

    @contextlib.contextmanager
    def try_locked(self) -> Iterator[OSError | None]:
        """:meth:`locked`, or no lock where the journal cannot be locked (an unwritable run
        dir), for actions that go on without one: yields None, or the error."""
        with contextlib.ExitStack() as stack:
            failed: OSError | None = None
            try:
                stack.enter_context(self.locked())
            except OSError as err:
                failed = err
            yield failed

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

    def shed(self, alive: Callable[[int | None], bool] | None = None) -> Hold | None:
        """The shed that holds on this slice now, or None: its entries folded into a
        :class:`Hold`. ``alive(pid)`` says whether the shedder still runs (a dead one's
        watchdog reverted its changes: nothing holds), and where the shedder recorded its
        start time, its pid must have started then (rundir/liveness.py: a reused pid is not
        it)."""
        held: Hold | None = None
        for e in self.entries():
            if e.get("source") != "shed":
                continue
            step = e.get("step")
            if step == ShedStep.RELEASE:
                held = None
                continue
            if held is None or held.pid != e.get("pid"):
                held = Hold(
                    by=e.get("by"), pid=e.get("pid"), pid_start=e.get("pid_start"),
                    since=e.get("time"),
                )  # fmt: skip
            held.when = e.get("when", held.when)
            held.took(step, e.get("changes", ()))
        if held is None or alive is None:
            return held
        runs = alive(held.pid) and (held.pid_start is None or started(held.pid, held.pid_start))
        return held if runs else None
