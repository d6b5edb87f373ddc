"""Apply, observe and remove a Plan by writing cgroupfs directly, with rollback.

``apply`` records every directory it created, every controller it added and every file's
previous value in an :class:`Applied`, so a failure part-way restores the tree as it was and a
later process can roll back from a JSON state file. Kernel I/O goes through
:class:`~governor.kernel.cgroupfs.CgroupFs` only; this module decides what to write, in which
order, and how to undo it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from functools import partial

from governor.backends.protect import children_protection, protect_parents
from governor.errors import BackendError, GovernorError, HostError
from governor.kernel import files
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.parse import parse_cpulist
from governor.log import get_logger
from governor.plan.model import CgroupWrite, EnableControllers, Plan
from governor.record import asdict, record

log = get_logger(__name__)

# cgroup.kill SIGKILLs the subtree at once; the processes still have to exit and release their
# memory before cgroup.events says "populated 0" (a D-state task can take a while)
REMOVE_TIMEOUT_S = 5.0
REMOVE_POLL_S = 0.02
# files whose value is a CPU/node list: "1,2" and "1-2" are the same set
_LIST_FILES = frozenset({files.CPUSET_CPUS, files.CPUSET_MEMS})


@record(frozen=True)
class WriteRecord:
    """One file the backend wrote, with what it held before (the value rollback restores)."""

    cgroup: str
    file: str
    previous: str
    value: str


@record(frozen=True)
class EnableRecord:
    """Controllers the backend ADDED to ``<cgroup>/cgroup.subtree_control`` (not ones on before)."""

    cgroup: str
    controllers: tuple[str, ...]


@record(frozen=True)
class Applied:
    """What ``apply`` changed, in the order it changed it; JSON round-trips for a state file."""

    policy: str
    cgroup_root: str
    created: tuple[str, ...] = ()  # directories created, top-down
    enabled: tuple[EnableRecord, ...] = ()
    writes: tuple[WriteRecord, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Applied:
        d = json.loads(text)
        return cls(
            policy=d["policy"],
            cgroup_root=d["cgroup_root"],
            created=tuple(d["created"]),
            enabled=tuple(
                EnableRecord(cgroup=e["cgroup"], controllers=tuple(e["controllers"]))
                for e in d["enabled"]
            ),
            writes=tuple(WriteRecord(**w) for w in d["writes"]),
        )


@record(frozen=True)
class Observation:
    write: CgroupWrite
    live: str | None  # None: the file (or the cgroup) does not exist
    matches: bool


@record(frozen=True)
class Removed:
    killed: bool  # the group was populated and had to be killed
    removed: tuple[str, ...]  # directories removed, bottom-up
    kept: tuple[str, ...] = ()  # the slice, when something else still lives in it


def _restorable(file: str, text: str) -> str:
    """The value to write back so the file holds ``text`` again."""
    if file == files.IO_WEIGHT:
        # io.weight reads "default 100\n8:0 200\n" but takes one line per write; the backend
        # only ever writes the default line, so that is the line to restore
        for line in text.splitlines():
            if line.startswith("default"):
                return line.strip()
    return text.strip()


def _same(file: str, live: str, planned: str) -> bool:
    if file in _LIST_FILES:
        try:
            return parse_cpulist(live) == parse_cpulist(planned)
        except ValueError:
            return False
    if file == files.IO_WEIGHT:
        return _restorable(file, live) == planned.strip()
    return live.strip() == planned.strip()


def _ancestors_and_self(cgroup: str) -> list[str]:
    parts = cgroup.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


class CgroupfsBackend:
    """The cgroupfs backend: ``apply`` / ``observe`` / ``remove`` / ``rollback`` / ``lock``."""

    def __init__(
        self,
        fs: CgroupFs,
        *,
        kill_pid: Callable[[int, int], None] = os.kill,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        remove_timeout_s: float = REMOVE_TIMEOUT_S,
    ) -> None:
        self.fs = fs
        self._kill_pid = kill_pid
        self._sleep = sleep
        self._clock = clock
        self._remove_timeout_s = remove_timeout_s

    # --- apply ---------------------------------------------------------------------------------

    def check_controllers(self, plan: Plan) -> None:
        """Fail closed (exit 69) unless the root offers every controller the plan needs."""
        available = self.fs.controllers("")
        missing = tuple(c for c in plan.controllers if c not in available)
        if missing:
            where = self.fs.path("") / files.CGROUP_CONTROLLERS
            raise HostError(
                f"controller{'s' if len(missing) > 1 else ''} {', '.join(missing)} not available"
                f" (not in {where})",
                hint="the kernel does not offer it at the cgroup2 root (not built in, turned off"
                " with cgroup_disable=, or held by a cgroup v1 hierarchy); or run without that"
                " limit: --allow-missing " + ",".join(missing),
                missing=missing,
            )

    def apply(self, plan: Plan) -> Applied:
        """Create, enable and write the plan; on any failure restore everything and re-raise."""
        self.check_controllers(plan)
        created: list[str] = []
        enabled: list[EnableRecord] = []
        writes: list[WriteRecord] = []
        try:
            pending = list(plan.enable)

            def enable(steps: list[EnableControllers]) -> None:
                for step in steps:
                    pending.remove(step)
                    current = self.fs.subtree_control(step.cgroup)
                    missing = tuple(c for c in step.controllers if c not in current)
                    if not missing:
                        continue
                    self.fs.enable(step.cgroup, missing)
                    enabled.append(EnableRecord(cgroup=step.cgroup, controllers=missing))
                    log.info("cgroup.enable", cgroup=step.cgroup, controllers=list(missing))

            for cgroup in plan.create:
                # the parent's controllers go on BEFORE the child exists, so the child's
                # memory.*/cpu.* files appear with it: nobody watching sees a bare directory
                parent = cgroup.rpartition("/")[0]
                enable([s for s in pending if s.cgroup == parent])
                if self.fs.mkdir(cgroup):
                    created.append(cgroup)
                    log.info("cgroup.mkdir", cgroup=cgroup)
            enable(list(pending))
            for w in plan.writes:
                previous = _restorable(w.file, self.fs.read(w.cgroup, w.file))
                self.fs.write(w.cgroup, w.file, w.value)
                writes.append(
                    WriteRecord(cgroup=w.cgroup, file=w.file, previous=previous, value=w.value)
                )
                log.info(
                    "cgroup.write", cgroup=w.cgroup, file=w.file, value=w.value, previous=previous
                )
            writes.extend(self._protect_parents(plan, raise_only=True))
        except BaseException:
            # BaseException too: a ^C half-way must not leave a half-configured tree behind
            partial = Applied(
                policy=plan.policy,
                cgroup_root=plan.cgroup_root,
                created=tuple(created),
                enabled=tuple(enabled),
                writes=tuple(writes),
            )
            self._restore(partial)
            raise
        return Applied(
            policy=plan.policy,
            cgroup_root=plan.cgroup_root,
            created=tuple(created),
            enabled=tuple(enabled),
            writes=tuple(writes),
        )

    # --- protection of the slices above the group --------------------------------------------

    def _protect_parents(self, plan: Plan, *, raise_only: bool) -> list[WriteRecord]:
        """Keep each governor-made ancestor's memory.min/low at the sum of its children's
        (governor/backends/protect.py), under a lock on each ancestor."""
        parents = [p for p in _ancestors_and_self(plan.group)[:-1] if p in plan.create]
        done = protect_parents(self.fs, parents, plan.protect_parents, raise_only=raise_only)
        return [WriteRecord(cgroup=c, file=f, previous=p, value=v) for c, f, p, v in done]

    def children_protection(self, parent: str, file: str) -> int | None:
        return children_protection(self.fs, parent, file)

    # --- rollback ------------------------------------------------------------------------------

    def rollback(self, applied: Applied) -> None:
        """Undo ``applied``; tries every step, then raises the first failure (if any)."""
        failures = self._restore(applied)
        if failures:
            raise failures[0]

    def _restore(self, applied: Applied) -> list[Exception]:
        """Undo in reverse: previous values, then created dirs bottom-up, then added controllers.

        Directories go before controllers because an ancestor cannot drop a controller that a
        child still has in its own subtree_control (EBUSY on older kernels). Writes into
        directories about to be removed are not restored; they go with the directory. Steps
        whose cgroup no longer exists are skipped, so rolling back twice is harmless.
        Failures are logged as ``rollback.failed`` and returned, never raised here.
        """
        created = set(applied.created)
        failures: list[Exception] = []
        log.info(
            "rollback.start",
            policy=applied.policy,
            writes=len(applied.writes),
            enabled=len(applied.enabled),
            created=len(applied.created),
        )

        def attempt(step: str, cgroup: str, action: Callable[[], None], **fields: object) -> None:
            if not self.fs.exists(cgroup):
                return
            try:
                action()
            except Exception as err:
                failures.append(err)
                log.error("rollback.failed", step=step, cgroup=cgroup, error=str(err), **fields)

        for rec in reversed(applied.writes):
            if rec.cgroup in created:
                continue
            attempt(
                "write",
                rec.cgroup,
                partial(self.fs.write, rec.cgroup, rec.file, rec.previous),
                file=rec.file,
                value=rec.previous,
            )
        for cgroup in reversed(applied.created):
            attempt("rmdir", cgroup, partial(self.fs.rmdir, cgroup))
        for en in reversed(applied.enabled):
            if en.cgroup in created:
                continue
            attempt(
                "disable",
                en.cgroup,
                partial(self.fs.disable, en.cgroup, en.controllers),
                controllers=list(en.controllers),
            )
        log.info("rollback.done", policy=applied.policy, failed=len(failures))
        return failures

    # --- observe -------------------------------------------------------------------------------

    def observe(self, plan: Plan) -> list[Observation]:
        """Each planned write next to the live value; ``None`` when the file is missing."""
        out: list[Observation] = []
        for w in plan.writes:
            try:
                live: str | None = self.fs.read(w.cgroup, w.file)
            except BackendError as err:
                if err.errno != errno.ENOENT:
                    raise
                live = None
            matches = live is not None and _same(w.file, live, w.value)
            out.append(
                Observation(write=w, live=None if live is None else live.strip(), matches=matches)
            )
        return out

    # --- remove --------------------------------------------------------------------------------

    def _populated(self, cgroup: str) -> bool:
        try:
            return self.fs.events(cgroup).get("populated", 0) != 0
        except BackendError as err:
            if err.errno != errno.ENOENT:
                raise
            return False  # gone meanwhile: nothing runs there

    def _kill_subtree(self, group: str) -> bool:
        """cgroup.kill (True), or SIGKILL each pid where the kernel has none (< 5.14, False)."""
        try:
            self.fs.kill(group)
            log.info("cgroup.kill", cgroup=group)
            return True
        except BackendError as err:
            if err.errno != errno.ENOENT:
                raise
            if not self.fs.exists(group):
                return True  # removed meanwhile (a launch's own cleanup): nothing to kill
        for cgroup in self.fs.subtree(group):
            for pid in self.fs.procs(cgroup):
                # ESRCH: it exited between reading cgroup.procs and the kill
                with suppress(ProcessLookupError):
                    self._kill_pid(pid, signal.SIGKILL)
        log.info("cgroup.kill", cgroup=group, fallback="sigkill")
        return False

    def _wait_empty(self, group: str, *, fallback: bool) -> None:
        deadline = self._clock() + self._remove_timeout_s
        while self._populated(group):
            if self._clock() >= deadline:
                raise BackendError(
                    f"cgroup still populated {self._remove_timeout_s:g}s after kill",
                    cgroup=group,
                    file=files.CGROUP_EVENTS,
                    hint="a process may be stuck in uninterruptible sleep (D state)",
                )
            if fallback:
                # without cgroup.kill a fork can slip past the first round of SIGKILLs
                self._kill_subtree(group)
            self._sleep(REMOVE_POLL_S)

    def remove(self, plan: Plan, *, owned: Collection[str] | None = None) -> Removed:
        """Kill what runs in the group, remove group and leaf, and the slice if it is empty.

        ``owned`` (what the lock/apply or `governor apply` created): the slice goes only when in
        it, never an operator's; None: any empty slice the plan creates. Idempotent; ancestors'
        controllers stay enabled (other cgroups may rely on them).
        """
        killed = False
        removed: list[str] = []
        kept: list[str] = []
        if self.fs.exists(plan.group):
            if self._populated(plan.group):
                killed = True
                used_cgroup_kill = self._kill_subtree(plan.group)
                self._wait_empty(plan.group, fallback=not used_cgroup_kill)
            for cgroup in reversed(self.fs.subtree(plan.group)):
                if self._rmdir_if_exists(cgroup):
                    removed.append(cgroup)
        slice_ = plan.slice
        if plan.protect_parents:
            self._protect_parents(plan, raise_only=False)
        # only a slice this plan would create; never systemd's system.slice or the root
        mine = slice_ in plan.create and (owned is None or slice_ in owned)
        if slice_ and not mine and slice_ in plan.create and self.fs.exists(slice_):
            kept.append(slice_)  # there before this governor: not ours to remove
        elif slice_ and mine and self.fs.exists(slice_):
            if self.fs.children(slice_) or self.fs.procs(slice_):
                kept.append(slice_)
            else:
                try:
                    if self._rmdir_if_exists(slice_):
                        removed.append(slice_)
                except BackendError as err:
                    if err.errno != errno.EBUSY:
                        raise
                    kept.append(slice_)  # another policy started in it meanwhile
        log.info("cgroup.removed", group=plan.group, removed=removed, kept=kept, killed=killed)
        return Removed(killed=killed, removed=tuple(removed), kept=tuple(kept))

    def _rmdir_if_exists(self, cgroup: str) -> bool:
        try:
            self.fs.rmdir(cgroup)
        except BackendError as err:
            if err.errno == errno.ENOENT:
                return False
            raise
        return True

    # --- lock ----------------------------------------------------------------------------------

    @contextmanager
    def lock(self, plan: Plan) -> Iterator[list[str]]:
        """Hold ``flock(LOCK_EX)`` on the group directory: one running launch per policy.

        Creates the group (and its parents) when needed and yields what it created (the caller
        owns those); on exit removes the directories it created if they are empty again (e.g.
        after a failed apply rolled back).
        """
        created: list[str] = []
        for cgroup in _ancestors_and_self(plan.group):
            if self.fs.mkdir(cgroup):
                created.append(cgroup)
        fd = self.fs.open_dir(plan.group)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise HostError(
                    f"policy {plan.policy} is already running in {plan.group}"
                    f" (a lock on {self.fs.root}/{plan.group})",
                    hint="stop the other launch or use a different policy name",
                ) from None
            except OSError as err:
                raise BackendError(
                    "cannot lock cgroup directory", cgroup=plan.group, errno=err.errno
                ) from err
            log.debug("cgroup.locked", cgroup=plan.group)
            yield list(created)
        finally:
            os.close(fd)
            for cgroup in reversed(created):
                self._remove_if_empty(cgroup)

    def _remove_if_empty(self, cgroup: str) -> None:
        try:
            if not self.fs.exists(cgroup) or self.fs.children(cgroup) or self.fs.procs(cgroup):
                return
            self.fs.rmdir(cgroup)
        except GovernorError as err:
            # a concurrent launch may be using it; leaving an empty dir is harmless
            log.warning("cgroup.cleanup_skipped", cgroup=cgroup, error=str(err))
