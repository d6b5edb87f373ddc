"""The `shed` action (issue 23): take memory from slices of a LOWER QoS class, gracefully, and
give it back.

Slices: the other governed slices whose published run state (governor/rundir/state.py) is
live and whose plan's ``[qos] class`` ranks below this policy's, plus the board file's
ungoverned cgroups (governor/board/file.py) of a lower class. Never an equal or higher class
(two interactive policies never shed each other), never this policy's own group, an ancestor
or a descendant of it. Lowest class first, within a class the largest (memory.current).

The ladder, per victim, restricted to the steps its ``[qos] yield`` allows:

- **unload** (issue 38): a router victim's LRU idle model (unload.py: bounded), again while idle;
- **throttle**: memory.high := its memory.current (not below its memory.min), so it cannot
  grow; the kernel reclaims it (to swap or zram where there is one) instead of the board;
- **freeze**: cgroup.freeze 1;
- **stop**: thawed, then SIGTERM to its engine (a governed slice's published engine pid; every
  process of an ungoverned cgroup), and ``STOP_GRACE_S`` before a kill may follow;
- **kill**: cgroup.kill.

A step is taken only when the rule fires (it still holds) and ``SETTLE_S`` after the previous
one. Once every shedding rule has been quiet for its cooldown, the shed is undone in reverse,
one step per ``SETTLE_S``: the latest victim first, thaw, then memory.high raised in
``RAISE_STEPS`` steps back to the victim's policy value (its operator's tune; an ungoverned
cgroup's value before the throttle), then ``release``; a raise lets the victim grow only into
MemAvailable less ``ROOM_HEADROOM`` (else it waits, held). A stopped or killed victim has
nothing to give back. When the monitor stops, whatever is held is given back at once.

No fights: each step and undo is an entry (``source: "shed"``) in the victim's journal
(governor/rundir/journal.py), its own monitor's baseline and what `governor status` shows; the
watchdog (governor/supervise/watchdog.py) reverts a dead shedder's holds; ``totals`` counts
steps (``governor_shed_total``); a victim another live shedder holds is passed over.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from governor.board.order import order, usage_frees
from governor.board.scan import scan
from governor.board.slice import QosClass, Slice
from governor.board.steps import Steps, change, journal, locked
from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.parse import parse_max
from governor.log import get_logger
from governor.monitor.actions.base import Context, Result
from governor.monitor.actions.unload import bounded_router, unload_lru
from governor.monitor.sources import protected_cache
from governor.monitor.victims import own_process_cgroup
from governor.peer.router import RouterClient
from governor.plan.model import Plan, ShedStep
from governor.record import field, record, replace
from governor.rundir.journal import Hold
from governor.rundir.liveness import alive as governor_alive

log = get_logger(__name__)

SETTLE_S = 3.0  # between two steps (shed or undo): the previous one takes effect first
STOP_GRACE_S = 10.0  # after the SIGTERM of `stop`, before a `kill` may follow
RAISE_STEPS = 4  # memory.high goes back to the victim's value in this many steps
RAISE_MIN = 16 << 20  # ... of at least this many bytes each
ROOM_HEADROOM = 128 << 20  # a raise leaves the board at least this much MemAvailable


class Wait:
    """The grace after a `stop`: no step now, the victim is not passed over."""


WAIT = Wait()


class Reverter(Protocol):
    """The watchdog's side of a shed (governor/supervise/watchdog.py)."""

    def arm_shed(self, cgroup_root: str, reverts: list[tuple[str, str, str]]) -> None: ...


@record
class Held:
    """What this shedder did to one victim: the :class:`Hold` its journal folds to (the steps
    done, frozen), and what the undo needs besides."""

    victim: Slice
    hold: Hold = field(default_factory=Hold)
    before_high: str | None = None  # memory.high before the throttle
    stopped_at: float | None = None
    raise_by: int | None = None
    raises: int = 0


class Shedder:
    def __init__(
        self,
        fs: CgroupFs,
        plan: Plan,
        *,
        run: Path,
        board: Path | None = None,
        watchdog: Reverter | None = None,
        clock: Callable[[], float] = time.monotonic,
        kill: Callable[[int, int], None] = os.kill,
        alive: Callable[[int | None], bool] = governor_alive,
        settle_s: float = SETTLE_S,
        page_size: int = os.sysconf("SC_PAGE_SIZE"),
        pid: int | None = None,
        memavailable: Callable[[], int | None] | None = None,
        own_cgroup: str | None = None,
        router: Callable[[str], RouterClient] = bounded_router,
    ) -> None:
        self.fs = fs
        self.plan = plan
        self.by = plan.policy
        self.rank = (QosClass.of(plan.qos.qos_class) or QosClass.STANDARD).rank
        self.run = run
        self.board = board
        self.watchdog = watchdog
        self.clock = clock
        self.kill = kill
        self.alive = alive
        self.settle_s = settle_s
        self.page_size = page_size
        self.pid = pid or os.getpid()  # what the victims' journals name this shedder by
        self.memavailable = memavailable  # the board's MemAvailable: how far a raise may go
        self.router = router  # a victim router's client, by its url (unload.py UNLOAD_S bounds it)
        self.held: dict[str, Held] = {}  # in the order of their first step
        self.last_step_at: float | None = None
        self.totals: dict[tuple[str, str], int] = {}  # (victim, step) -> times
        # this process's own cgroup (/proc/self/cgroup): never a victim, nor its ancestors or
        # descendants, whatever policy (or none) it runs under
        self.own_cgroup = own_cgroup if own_cgroup is not None else own_process_cgroup()
        self._said: set[tuple[str, str]] = set()  # (event, reason): each problem told once
        self.steps = Steps(fs, kill=kill, page_size=page_size, unload=self._unload)
        self._failed: dict[str, list[str]] = {}  # victim -> its steps that failed, not retried
        self._undo_waited_at: float | None = None  # the undo's latest wait for room

    # ------------------------------------------------------------------ victims

    def victims(self) -> list[Slice]:
        """Every slice this policy may shed now, in the one victim order (board/order.py; no
        deficit known: each class largest first by memory.current). A bad state or board entry
        is skipped with one log line (the board is scanned again at every firing)."""
        seen = scan(
            run=self.run, cgroup_root=self.fs.root, board=self.board, own=(self.plan.group,),
            fs=self.fs,
        )  # fmt: skip
        said, bad = self._invalid("shed.victim_invalid"), self._invalid("shed.board_invalid")
        for who, why in seen.invalid:
            said(who, why)
        for who, why in seen.file_invalid:
            bad(who, why)
        out = [
            v
            for v in seen.slices
            if v.governed and v.state == "running" and v.name != self.by
            and v.cgroup_root == self.plan.cgroup_root and v.qos.rank < self.rank
        ]  # fmt: skip
        out += [v for v in seen.cgroups if v.qos.rank < self.rank]
        out = [
            replace(v, current=self._usage(v.cgroup))
            for v in out
            if not self._related(v.cgroup) and self._exists(v, bad)
        ]
        return order(out, None, frees=usage_frees, stop=False)

    def _exists(self, v: Slice, bad: Callable[[str, str], None]) -> bool:
        try:
            return self.fs.exists(v.cgroup)
        except (GovernorError, ValueError, OSError) as err:
            bad(v.name, f"{v.name}: {err}")
            return False

    def _invalid(self, event: str) -> Callable[[str, str], None]:
        def said(victim: str, reason: str) -> None:
            if (event, reason) not in self._said:
                self._said.add((event, reason))
                log.warning(event, by=self.by, victim=victim, reason=reason, detail="skipped")

        return said

    def _related(self, cgroup: str) -> bool:
        """``cgroup`` is, contains or lies inside this policy's group or this process's own."""
        return any(
            cgroup == own or own.startswith(cgroup + "/") or cgroup.startswith(own + "/")
            for own in (self.plan.group, self.own_cgroup)
            if own is not None
        )

    def _usage(self, cgroup: str) -> int:
        return self.fs.read_limit(cgroup, kf.MEMORY_CURRENT, unreadable=0) or 0

    # ------------------------------------------------------------------ shedding

    def shed(self, ctx: Context) -> Result:
        """One step of the ladder (the rule fired): on the first victim that has one left."""
        now = self.clock()
        if self.last_step_at is not None and now - self.last_step_at < self.settle_s:
            return Result("shed", ok=True, detail="settling after the previous step")
        failed: Result | None = None
        for victim in self.victims():
            if victim.name not in self.held and self._held_by_another(victim):
                continue  # one shedder per victim: the first keeps it until its release
            held = self.held.get(victim.name) or Held(victim)
            step: ShedStep | Wait | None = None
            for _ in range(len(victim.yields)):  # each step at most once per firing
                step = self._next_step(victim, held, now)
                if step is None or isinstance(step, Wait):
                    break
                with self._locked(victim):
                    res = self._take(victim, held, step, ctx, now)
                if res.ok:
                    return res
                failed = res  # not retried: the next step of its yield, or the next victim
            if step is WAIT:
                return Result("shed", ok=True, detail=f"{victim.name}: grace after stop")
        return failed or Result("shed", ok=True, detail="nothing left to shed")

    def _unload(self, victim: Slice) -> str | None:
        return unload_lru(self.router, victim.router_url, victim.router_last, victim.cgroup)

    def _held_by_another(self, victim: Slice) -> bool:
        """Another live shedder holds ``victim`` (its journal says so): two shedders on one
        victim would undo each other's steps."""
        if victim.journal is None:
            return False
        other = victim.journal.shed(self.alive)
        return other is not None and other.pid != self.pid

    def _next_step(self, victim: Slice, held: Held, now: float) -> ShedStep | Wait | None:
        steps = held.hold.steps
        if ShedStep.KILL in steps or (
            ShedStep.STOP in steps and not self.steps.populated(victim.cgroup)
        ):
            return None  # gone
        failed = self._failed.get(victim.name, [])
        left = [s for s in victim.yields if s not in steps and s not in failed]
        if victim.router_url is None and ShedStep.UNLOAD in left:  # not a router: passed over
            left.remove(ShedStep.UNLOAD)
        if victim.stays:  # its claim outlives a stop (board/order.py): never stopped
            left = [s for s in left if s not in (ShedStep.STOP, ShedStep.KILL)]
        if not left:
            return None
        stopped = held.stopped_at
        if left[0] == ShedStep.KILL and stopped is not None and now - stopped < STOP_GRACE_S:
            return WAIT
        return ShedStep(left[0])

    def _take(self, victim: Slice, held: Held, step: str, ctx: Context, now: float) -> Result:
        cg = victim.cgroup
        try:
            taken = self.steps.take(victim, step, held.hold)
        except GovernorError as err:
            self._failed.setdefault(victim.name, []).append(step)
            log.warning(
                "shed.step_failed", by=self.by, victim=victim.name, cgroup=cg, step=step,
                reason=str(err), detail="not retried: the next step or the next victim",
            )  # fmt: skip
            return Result(
                "shed", ok=False, after={"victim": victim.name, "step": step}, detail=str(err)
            )
        changes, model = taken.changes, taken.model
        if step == ShedStep.THROTTLE:
            if held.before_high is None:
                held.before_high = taken.before_high
            held.raise_by, held.raises = None, 0  # a new undo starts from this throttle
        elif step == ShedStep.STOP:
            held.stopped_at = now
        held.hold.took(step, changes)
        if held.hold.since is None:
            held.hold.by, held.hold.pid, held.hold.since = self.by, self.pid, time.time()
        held.hold.when = ctx.when
        self.held[victim.name] = held
        self.last_step_at = now
        self._count(victim.name, step)
        extra = {} if model is None else {"model": model}
        self._journal(victim, step, changes, when=ctx.when, value=ctx.value, **extra)
        self._arm()
        took: dict[str, Any] = {"victim": victim.name, "cgroup": cg, "step": step, **extra}
        log.warning("shed.step", by=self.by, rule=ctx.rule, when=ctx.when, **took)
        return Result("shed", ok=True, after={**took, "changes": changes} if changes else took)

    # ------------------------------------------------------------------ giving back

    def holding(self) -> bool:
        """Something is held, or a failed step is remembered (the quiet undo forgets it)."""
        return bool(self.held or self._failed)

    def held_groups(self) -> list[str]:
        """The cgroups of the victims held now (governor/monitor/ownstall.py reads them)."""
        return [h.victim.cgroup for h in self.held.values()]

    def undo(self) -> Result | None:
        """One undo step (the shedding rules are quiet), at most one per SETTLE_S."""
        now = self.clock()
        times = [t for t in (self.last_step_at, self._undo_waited_at) if t is not None]
        if not self.held:
            self._failed.clear()  # quiet: pressure that comes back tries every step again
            return None
        if times and now - max(times) < self.settle_s:
            return None
        name, held = next(reversed(self.held.items()))
        with self._locked(held.victim):
            step, changes = self._give_back(held)
            if step is None:  # no room: try again later, without holding back a shed step
                self._undo_waited_at = now
                return None
            self._journal(held.victim, step, changes, when="quiet")
        self.last_step_at = now
        if step == ShedStep.RELEASE:
            del self.held[name]
        self._count(name, step)
        self._arm()
        log.info("shed.undo", by=self.by, victim=name, cgroup=held.victim.cgroup, step=step)
        return Result("unshed", ok=True, after={"victim": name, "step": step, "changes": changes})

    def _give_back(self, held: Held) -> tuple[ShedStep | None, list[dict[str, Any]]]:
        cg = held.victim.cgroup
        gone = ShedStep.KILL in held.hold.steps or ShedStep.STOP in held.hold.steps
        try:
            if held.hold.frozen and not gone:
                self.fs.freeze(cg, False)
                held.hold.frozen = False
                held.hold.steps.remove(ShedStep.FREEZE)  # pressure that comes back may freeze again
                return ShedStep.THAW, [change(cg, kf.CGROUP_FREEZE, "1", "0")]
            if held.before_high is None or gone or not self.fs.exists(cg):
                return ShedStep.RELEASE, []
            now_high = self.fs.read(cg, kf.MEMORY_HIGH).strip()
            goal = self._goal(held)
            current, target = parse_max(now_high), parse_max(goal)
            if current is None:
                return ShedStep.RELEASE, []
            if held.raise_by is None:
                gap = (target - current) if target is not None else current
                held.raise_by = max(RAISE_MIN, gap // RAISE_STEPS)
            new = current + held.raise_by
            capped = False
            room = self._room()
            if room is not None:  # it may grow into what the board has, not beyond
                bound = self._usage(cg) + room
                if bound < current + RAISE_MIN:
                    log.info("shed.no_room", victim=held.victim.name, cgroup=cg, room=room)
                    return None, []  # held as it is until the board has room
                capped, new = bound < new, min(new, bound)
            held.raises += 1
            if ShedStep.THROTTLE in held.hold.steps:  # ... or throttle it again at what it uses
                held.hold.steps.remove(ShedStep.THROTTLE)
            final = not capped and (
                (target is not None and new >= target)
                or (target is None and held.raises >= RAISE_STEPS)
            )
            value = goal if final else str(self.steps.floor(new))
            self.fs.write(cg, kf.MEMORY_HIGH, value)
            after = self.fs.read(cg, kf.MEMORY_HIGH).strip()
            changes = [change(cg, kf.MEMORY_HIGH, now_high, after)]
            if final:
                held.before_high = None
            return ShedStep.RAISE, changes
        except GovernorError as err:
            log.warning("shed.undo_failed", victim=held.victim.name, cgroup=cg, reason=str(err))
            return ShedStep.RELEASE, []

    def _room(self) -> int | None:
        """What the board can give a victim now: MemAvailable less ``ROOM_HEADROOM`` and less
        the shedder's own page cache that its memory.min protects (MemAvailable counts it as
        reclaimable: the engine's model, which the kernel will not take)."""
        avail = self.memavailable() if self.memavailable is not None else None
        if avail is None:
            return None
        return max(0, avail - ROOM_HEADROOM - protected_cache(self.fs, self.plan.group))

    def _goal(self, held: Held) -> str:
        """The memory.high to give back: the operator's tune, else the policy's value, else
        (ungoverned) the value before the throttle."""
        j = held.victim.journal
        tuned = None if j is None else j.tuned(kf.MEMORY_HIGH)
        if tuned is not None:
            return tuned
        if held.victim.restore_high is not None:
            return held.victim.restore_high
        return held.before_high or "max"

    def release_all(self, why: str) -> None:
        """Give everything back at once (the monitor stops)."""
        for name, held in list(self.held.items()):
            cg = held.victim.cgroup
            changes = []
            with self._locked(held.victim):
                try:
                    if held.hold.frozen:
                        self.fs.freeze(cg, False)
                        changes.append(change(cg, kf.CGROUP_FREEZE, "1", "0"))
                    if held.before_high is not None and self.fs.exists(cg):
                        before = self.fs.read(cg, kf.MEMORY_HIGH).strip()
                        self.fs.write(cg, kf.MEMORY_HIGH, self._goal(held))
                        after = self.fs.read(cg, kf.MEMORY_HIGH).strip()
                        changes.append(change(cg, kf.MEMORY_HIGH, before, after))
                except GovernorError as err:
                    log.warning("shed.undo_failed", victim=name, cgroup=cg, reason=str(err))
                self._journal(held.victim, ShedStep.RELEASE, changes, when=why)
            self._count(name, ShedStep.RELEASE)
            log.info("shed.undo", by=self.by, victim=name, cgroup=cg, step="release", reason=why)
        self.held.clear()
        self._failed.clear()
        self._arm()

    # ------------------------------------------------------------------ records

    def totals_list(self) -> list[dict[str, Any]]:
        """Steps per victim (the metric governor_shed_total{policy,victim,step})."""
        return [{"victim": v, "step": s, "count": n} for (v, s), n in sorted(self.totals.items())]

    def _count(self, victim: str, step: str) -> None:
        self.totals[(victim, step)] = self.totals.get((victim, step), 0) + 1

    def _journal(
        self,
        victim: Slice,
        step: str,
        changes: list[dict[str, Any]],
        *,
        when: str,
        value: Any = None,
        **extra: Any,
    ) -> None:
        journal(victim, step, changes, by=self.by, pid=self.pid, when=when, value=value, **extra)

    def _locked(self, victim: Slice) -> contextlib.AbstractContextManager[None]:
        return locked(victim)

    def _arm(self) -> None:
        """Tell the watchdog what to revert should this governor die: thaw what is frozen,
        memory.high back to the victim's value."""
        if self.watchdog is None:
            return
        reverts: list[tuple[str, str, str]] = []
        for held in self.held.values():
            if held.hold.frozen:
                reverts.append(("thaw", "-", held.victim.cgroup))
            if held.before_high is not None:
                reverts.append(("high", self._goal(held), held.victim.cgroup))
        try:
            self.watchdog.arm_shed(self.plan.cgroup_root, reverts)
        except (OSError, ValueError) as err:
            log.warning("shed.watchdog_failed", reason=str(err))
