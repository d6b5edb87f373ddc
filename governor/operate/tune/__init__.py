"""`governor tune NAME KEY=VALUE...` and `governor rollback NAME`: change a live slice's limits
safely, journal every change, undo them.

Keys are spelled as in the policy (``memory.high``, ``memory.swap_max``, ``cpu.cpus``...),
values in the policy's syntax (``1.5GiB``, ``70%``, ``max``, ``4-7``, ``big``). The running
policy (from the published state) is re-validated with the new values by the same rules
(policy model + compiler: min <= low <= high <= max after resolution), and the new kernel
values are what that compile writes. Guards against the live group (Kubernetes' in-place resize
lesson, kubernetes#135670): memory.max below memory.current + a margin, or below memory.min, is
refused with the numbers (65) unless ``force``. Lowering memory.max goes in stages: memory.high
first, memory.reclaim of the excess, then memory.max, then memory.high's own target. After the
writes, memory.events is read again: an OOM kill during the change reverts every write (71).

This module holds the steps (keys, guards, staged writes, rollback, the policy file's rewrite);
route.py sorts a tune's files by their way to the kernel, persisted.py is --persist, flow.py
runs a tune end to end with an undo for every route, undo.py is `governor rollback`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tomlkit

from governor.backends.manager import ManagerWriter
from governor.deploy.tunedropin import udiff, write_atomic
from governor.errors import BackendError, GovernorError, PolicyError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.plan.unitmap import tunable
from governor.rundir.journal import CHANGING, Journal

# policy key -> (section, field, kernel file, integer-typed in the policy): the rows of the one
# table (governor/plan/unitmap.py) that `governor tune` takes
TUNABLE: dict[str, tuple[str, str, str, bool]] = {
    key: (key.partition(".")[0], key.partition(".")[2], m.cgroup_file, m.integer)
    for key, m in tunable().items()
}
MARGIN_MIN = 32 << 20  # memory.max may not go below memory.current + max(32 MiB, 5 %)
ORDER = (  # write order for raising; lowering memory.max is staged (apply())
    kf.PIDS_MAX,
    kf.MEMORY_SWAP_MAX,
    kf.MEMORY_MIN,
    kf.MEMORY_LOW,
    kf.MEMORY_MAX,
    kf.MEMORY_HIGH,
    kf.IO_WEIGHT,
    kf.CPU_WEIGHT,
    kf.CPU_MAX,
    kf.CPUSET_CPUS,
)


def parse_assignments(args: Sequence[str]) -> dict[tuple[str, str], object]:
    """``["memory.high=1.5GiB", "cpu.weight=200"]`` -> policy overrides; 65 naming the bad one."""
    out: dict[tuple[str, str], object] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.strip()
        if not sep or key not in TUNABLE:
            raise PolicyError(
                f"cannot tune {key!r}" if sep else f"expected KEY=VALUE, got {arg!r}",
                field=key or arg,
                hint="keys: " + ", ".join(TUNABLE),
            )
        section, field, _file, integer = TUNABLE[key]
        value = value.strip()
        parsed: object = int(value) if integer and value.isdigit() else value
        out[(section, field)] = parsed
    return out


def _bytes(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return None if text == "max" else int(text.split()[0])


def margin(current: int) -> int:
    return max(MARGIN_MIN, current // 20)


def check_guards(fs: CgroupFs, group: str, changes: Mapping[str, str], *, force: bool) -> None:
    """Refuse (65, with the numbers) a memory.max below usage + margin or below memory.min."""
    if kf.MEMORY_MAX not in changes or force:
        return
    new_max = _bytes(changes[kf.MEMORY_MAX])
    if new_max is None:
        return
    current = _bytes(fs.read(group, kf.MEMORY_CURRENT)) or 0
    floor = _bytes(changes.get(kf.MEMORY_MIN) or fs.read(group, kf.MEMORY_MIN)) or 0
    need = current + margin(current)
    if new_max < need:
        raise PolicyError(
            f"memory.max {new_max} is below memory.current {current} + margin"
            f" {margin(current)} = {need}: the engine would be OOM-killed or thrash",
            field="memory.max",
            hint="lower memory.high first (it throttles and reclaims), or pass --force",
        )
    if new_max < floor:
        raise PolicyError(
            f"memory.max {new_max} is below memory.min {floor}",
            field="memory.max",
            hint="lower memory.min in the same tune, or pass --force",
        )


def steps(
    before: Mapping[str, str], changes: Mapping[str, str], current: int
) -> list[tuple[str, str]]:
    """The (file, value) writes, staged: a lower memory.max is preceded by memory.high at most
    that value and a memory.reclaim of what is above it; memory.high's own target comes last."""
    out: list[tuple[str, str]] = []
    new_max = _bytes(changes.get(kf.MEMORY_MAX)) if kf.MEMORY_MAX in changes else None
    old_max = _bytes(before.get(kf.MEMORY_MAX))
    lowering = (
        kf.MEMORY_MAX in changes and new_max is not None and (old_max is None or new_max < old_max)
    )
    if lowering:
        assert new_max is not None
        live_high = _bytes(before.get(kf.MEMORY_HIGH))
        if live_high is None or live_high > new_max:  # throttle and reclaim before the hard cut
            tuned_high = _bytes(changes.get(kf.MEMORY_HIGH))
            staged = new_max if tuned_high is None else min(new_max, tuned_high)
            out.append((kf.MEMORY_HIGH, str(staged)))
        if current > new_max - margin(current):
            out.append((kf.MEMORY_RECLAIM, str(current - new_max + margin(current))))
    for file in ORDER:
        if file not in changes:
            continue
        if lowering and file == kf.MEMORY_HIGH:
            continue  # after memory.max, below
        out.append((file, changes[file]))
    if lowering and kf.MEMORY_HIGH in changes:
        out.append((kf.MEMORY_HIGH, changes[kf.MEMORY_HIGH]))  # its own target, after the max
    return out


Writer = Callable[[str, str], None]  # (file, kernel value): cgroupfs, or the systemd manager


class OomReverted(BackendError):
    """An OOM kill happened while a tune was applied: every write was reverted (71)."""


def apply(
    fs: CgroupFs,
    group: str,
    changes: Mapping[str, str],
    *,
    journal: Journal,
    source: str = "tune",
    read_oom_kills: Callable[[], int] | None = None,
    write: Writer | None = None,
    unit: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``changes`` (file -> kernel value) in stages; revert everything if an OOM kill
    happened meanwhile (BackendError 71); journal what was done. Returns the journal entry.

    ``write`` defaults to the cgroup file itself; under systemd it is the manager
    (backends/manager.ManagerWriter) and ``unit`` ({"unit", "systemd"}) goes into each journaled
    change so that rollback and the --confirm reverter go through the manager too. ``extra``
    goes into the journal entry (confirm_by, reverter_pid, dropin)."""

    def oom_kills() -> int:
        try:
            return fs.memory_events(group).get("oom_kill", 0)
        except GovernorError:
            return 0

    count = read_oom_kills or oom_kills
    put: Writer = write or (lambda file, value: fs.write(group, file, value))
    before = {f: fs.read(group, f).strip() for f in changes}
    try:
        current = _bytes(fs.read(group, kf.MEMORY_CURRENT)) or 0
    except GovernorError:
        current = 0
    if kf.MEMORY_HIGH not in before and kf.MEMORY_MAX in changes:
        with contextlib.suppress(GovernorError):
            before[kf.MEMORY_HIGH] = fs.read(group, kf.MEMORY_HIGH).strip()
    kills = count()
    written: list[tuple[str, str]] = []
    try:
        for file, value in steps(before, changes, current):
            if file == kf.MEMORY_RECLAIM:
                try:
                    put(file, value)
                except BackendError as err:
                    # EAGAIN: reclaimed less than asked; ENOENT: no memory.reclaim (Linux <
                    # 5.19), where the staged memory.high's write reclaimed down to it already
                    # (mm/memcontrol.c memory_high_write) and memory.max's write reclaims too
                    if err.errno not in (errno.EAGAIN, errno.ENOENT):
                        raise
                continue
            if file not in before:
                before[file] = fs.read(group, file).strip()
            put(file, value)
            written.append((file, value))
        if count() > kills:
            raise OomReverted(
                "the change was reverted: an OOM kill happened while it was applied",
                cgroup=group,
                hint="raise the value, or lower memory.high first and let it reclaim",
            )
    except GovernorError:
        for file, _value in reversed(written):
            with contextlib.suppress(GovernorError):
                put(file, before[file])
        raise
    changes_done = [
        {
            "cgroup": group,
            "file": f,
            "before": before[f],
            "after": fs.read(group, f).strip(),
            **(unit or {}),
        }
        for f in dict.fromkeys(f for f, _v in written)
    ]
    return journal.append(source, changes_done, **(extra or {}))


def writer_for(fs: CgroupFs, change: Mapping[str, Any]) -> Writer:
    """How to restore one journaled change: through the manager when it was made through it."""
    if change.get("unit"):
        return ManagerWriter(fs, change["unit"], change["cgroup"], int(change["systemd"]))
    group = change["cgroup"]
    return lambda file, value: fs.write(group, file, value)


class NothingToRollBack(ValueError):
    """The journal has no change left that the rollback asked for would undo."""


def rollback(
    fs: CgroupFs,
    journal: Journal,
    *,
    to: int | None = None,
    everything: bool = False,
    ids: Sequence[int] | None = None,
    reason: str | None = None,
    restore_file: Callable[[Mapping[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Undo journal entries in reverse: the last tune (default), every entry after ``to``,
    ``everything`` (tunes and monitor actions), or exactly ``ids`` (the --confirm reverter).
    NothingToRollBack (a ValueError) when there is nothing to undo. An entry that persisted into a systemd drop-in
    (``dropin``) gets the file back first (``restore_file``), then the runtime values."""
    undone = journal.undone()
    live = [e for e in journal.entries() if e["source"] in CHANGING and e["source"] != "rollback"]
    live = [e for e in live if e["id"] not in undone]
    if ids is not None:
        chosen = [e for e in live if e["id"] in ids]
    elif everything:
        chosen = live
    elif to is not None:
        chosen = [e for e in live if e["id"] > to]
    else:
        tunes = [e for e in live if e["source"] == "tune"]
        chosen = tunes[-1:]
    if not chosen:
        raise NothingToRollBack("nothing to roll back")
    changes: list[dict[str, Any]] = []
    for entry in reversed(chosen):
        if entry.get("dropin") and restore_file is not None:
            restore_file(entry["dropin"])
        for ch in reversed(entry["changes"]):
            now = fs.read(ch["cgroup"], ch["file"]).strip()
            writer_for(fs, ch)(ch["file"], ch["before"])
            extra = {k: ch[k] for k in ("unit", "systemd") if k in ch}
            changes.append(
                {
                    "cgroup": ch["cgroup"],
                    "file": ch["file"],
                    "before": now,
                    "after": ch["before"],
                    **extra,
                }
            )
    more = {"reason": reason} if reason else {}
    return journal.append("rollback", changes, undoes=[e["id"] for e in chosen], **more)


def persist(path: str, overrides: Mapping[tuple[str, str], object]) -> str:
    """Write ``overrides`` into the policy file at ``path``, keeping its comments and layout
    (tomlkit); atomic (temp file + rename, same mode). Returns the unified diff (empty when the
    file already said so)."""

    with open(path) as f:
        old = f.read()
    doc = tomlkit.parse(old)
    for (section, key), value in overrides.items():
        table = doc.get(section)
        if table is None:
            table = tomlkit.table()
            doc[section] = table
        table[key] = value
    new = tomlkit.dumps(doc)
    if new == old:
        return ""
    write_atomic(path, new, os.stat(path).st_mode & 0o7777)
    return udiff(old, new, path)
