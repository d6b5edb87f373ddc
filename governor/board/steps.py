"""The per-victim steps of a shed (issue 44): unload, throttle, freeze, stop, kill, each one
write (or signal) on one slice, journaled in the victim's journal under its lock. The shed
ladder (monitor/actions/shedder.py) keeps only the timing between them and the undo; admission
(api/admit.py) stops the victims it chose with :func:`stop` directly.

- **unload**: a router victim's least recently used idle model (the caller's ``unload``: the
  router client lives with the monitor);
- **throttle**: memory.high := its memory.current (not below its memory.min, never above the
  value there now), so it cannot grow and the kernel reclaims it;
- **freeze**: cgroup.freeze 1;
- **stop**: thawed first (a frozen task handles its SIGTERM only once thawed), then SIGTERM to
  its published engine pid when that pid runs in its cgroup (a state is another process's
  file: a stale or forged pid is never signalled), else to every process of its cgroup;
- **kill**: every process of its cgroup (kernel/kill.py kill_tree), thawed after.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

from governor.board.slice import Slice
from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.kill import kill_tree
from governor.kernel.parse import parse_max
from governor.log import get_logger
from governor.plan.model import ShedStep
from governor.record import record
from governor.rundir.journal import Hold

log = get_logger("governor.shed")

Kill = Callable[[int, int], None]


@record
class Taken:
    """What one step changed (the journal entry's changes) and what its undo needs."""

    changes: list[dict[str, Any]]
    model: str | None = None  # unload: the model unloaded
    before_high: str | None = None  # throttle: memory.high before it


def change(cgroup: str, file: str, before: str, after: str) -> dict[str, Any]:
    return {"cgroup": cgroup, "file": file, "before": before, "after": after}


class Steps:
    """The five steps on one cgroup fs (module docstring)."""

    def __init__(
        self,
        fs: CgroupFs,
        *,
        kill: Kill = os.kill,
        page_size: int = 4096,
        unload: Callable[[Slice], str | None] | None = None,
    ) -> None:
        self.fs = fs
        self.kill = kill
        self.page_size = page_size
        self.unload = unload

    def take(self, victim: Slice, step: str, hold: Hold) -> Taken:
        """Take ``step`` on ``victim`` (``hold.frozen`` follows a freeze or a thaw); raises
        GovernorError when it cannot be taken."""
        cg = victim.cgroup
        if step == ShedStep.UNLOAD:  # holds nothing: nothing to give back
            if self.unload is None:
                raise GovernorError(f"no router client to unload a model ({victim.cgroup})")
            return Taken([], model=self.unload(victim))
        if step == ShedStep.THROTTLE:
            before = self.fs.read(cg, kf.MEMORY_HIGH).strip()
            target = self.floor(max(self.read(cg, kf.MEMORY_CURRENT), self.read(cg, kf.MEMORY_MIN)))
            limit = parse_max(before)
            if limit is not None:
                target = min(target, limit)
            self.fs.write(cg, kf.MEMORY_HIGH, str(target))
            after = self.fs.read(cg, kf.MEMORY_HIGH).strip()
            return Taken([change(cg, kf.MEMORY_HIGH, before, after)], before_high=before)
        if step == ShedStep.FREEZE:
            self.fs.freeze(cg, True)
            hold.frozen = True
            return Taken([change(cg, kf.CGROUP_FREEZE, "0", "1")])
        if step == ShedStep.STOP:
            changes = []
            if hold.frozen:
                self.fs.freeze(cg, False)
                hold.frozen = False
                changes.append(change(cg, kf.CGROUP_FREEZE, "1", "0"))
            pids = self.stop_pids(victim)
            if not pids and self.populated(cg):  # the engine pid is not in its group
                raise GovernorError(f"no process to stop in its group ({victim.cgroup})")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    self.kill(pid, signal.SIGTERM)
            return Taken(changes)
        if step == ShedStep.KILL:  # each pid by SIGKILL without cgroup.kill (< 5.14)
            kill_tree(self.fs, cg, self.kill)
            if hold.frozen:
                self.fs.freeze(cg, False)
                hold.frozen = False
            return Taken([])
        raise GovernorError(f"unknown shed step {step[:40]!r} ({victim.cgroup})")

    def stop_pids(self, victim: Slice) -> list[int]:
        pids = sorted(set(self.fs.procs_below(victim.cgroup)))
        if victim.governed and victim.engine_pid:
            if victim.engine_pid in pids:
                return [victim.engine_pid]
            log.warning("shed.engine_pid_untrusted", victim=victim.name, pid=victim.engine_pid)
        return pids

    def read(self, cgroup: str, file: str) -> int:
        return self.fs.read_limit(cgroup, file, unreadable=0) or 0

    def floor(self, n: int) -> int:
        return n // self.page_size * self.page_size

    def populated(self, cgroup: str) -> bool:
        try:
            return self.fs.populated(cgroup)
        except GovernorError:
            return False


@contextlib.contextmanager
def locked(victim: Slice) -> Iterator[None]:
    """The victim's journal lock around a step's writes and its entry: the victim's own
    monitor reads its baseline under the same lock (monitor/actions/limits.py, freeze.py), so
    it never lifts a throttle whose entry is not written yet. Without a journal (an unwritable
    run dir) the step still goes."""
    if victim.journal is None:
        yield
        return
    with victim.journal.try_locked() as failed:
        if failed is not None:
            log.warning("shed.journal_failed", victim=victim.name, reason=str(failed))
        yield


def journal(
    victim: Slice, step: str, changes: list[dict[str, Any]], *, by: str, pid: int, when: str,
    value: Any = None, **extra: Any,
) -> None:  # fmt: skip
    """The step's entry in the victim's journal (the caller holds :func:`locked`)."""
    if victim.journal is None:
        return
    try:
        victim.journal.append(
            "shed", changes, by=by, pid=pid, step=step, when=when, value=value, **extra
        )
    except OSError as err:
        log.warning("shed.journal_failed", victim=victim.name, reason=str(err))


def stop(fs: CgroupFs, victim: Slice, *, by: str, when: str, kill: Kill = os.kill) -> str | None:
    """Stop one victim once, outside the ladder (an admission making room): its yield's
    "stop", else "kill", under its journal lock with its entry; nothing stays held. The
    reason when it could not be stopped, else None."""
    step = next((s for s in (ShedStep.STOP, ShedStep.KILL) if s in victim.yields), None)
    if step is None or victim.stays:
        return f"{victim.name} yields no stop"
    with locked(victim):
        try:
            taken = Steps(fs, kill=kill).take(victim, step, Hold())
        except GovernorError as err:
            log.warning("shed.step_failed", by=by, victim=victim.name, step=step, reason=str(err))
            return str(err)
        journal(victim, step, taken.changes, by=by, pid=os.getpid(), when=when)
    log.warning("shed.step", by=by, rule=-1, when=when, victim=victim.name, step=step)
    return None
