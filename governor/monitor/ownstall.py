"""Board pressure that a shed's own victims make (issue 23).

A victim throttled at memory.high stalls in its own reclaim and in the kernel's penalty sleep
(mm/memcontrol.c: reclaim_high and mem_cgroup_handle_over_high run under psi_memstall_enter),
and that stall is counted in every ancestor up to the root, that is in the board's pressure.
A `shed` rule on a board trigger (``board memory some 100ms/1s``) would take the throttle it
set for more pressure: escalate because of it, and never be quiet long enough to give back.
Thawed at its throttle, a growing victim stalls at once, the rule fires and freezes it again:
a thaw/freeze loop while the board has memory to spare, and the job never completes.

So a firing of a shedding rule on a board PSI trigger, while victims are held, counts only when
over the trigger's window (the time between two readings, at least one window) either

- the stall outside the held victims reaches the trigger's threshold: the board's total minus
  the victims' totals, a lower bound of it (the board's "some" is the union of its groups'
  stalls, at most their sum), or
- the shedding policy's own group stalled that long (its engine felt it, whatever overlapped).

The threshold is the trigger's stall/window scaled to that time. Readings are taken at every
sample while something is held (governor/monitor/loop.py); without a reading a window old a
firing counts, as it would without this check: when in doubt, shed.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

from governor.errors import GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.log import get_logger
from governor.monitor import psi
from governor.plan.model import Plan, WatchTrigger

log = get_logger(__name__)

Key = tuple[str, Literal["some", "full"]]  # (resource, kind)
BOARD = ""  # the cgroup root: the board's pressure (= /proc/pressure)


class OwnStall:
    """Readings of the board's, the own group's and the held victims' stall totals."""

    def __init__(self, fs: CgroupFs, group: str, triggers: dict[int, WatchTrigger]) -> None:
        self.fs = fs
        self.group = group
        # the shedding rules on a board (system) PSI trigger, by rule index
        self.triggers = {i: t for i, t in triggers.items() if t.system}
        self.keys: set[Key] = {(t.resource, t.kind) for t in self.triggers.values()}
        keep = max((t.window_us for t in self.triggers.values()), default=0) / 1e6
        # bounded (issue 43 item 4): PSI windows are at most 10 s, samples at least 0.05 s apart
        self.keep_s = 2 * keep + 2.0
        # (time, {cgroup: {key: total us}}); BOARD, the own group and each victim read
        self.readings: deque[tuple[float, dict[str, dict[Key, int]]]] = deque()
        self.discounted = 0  # firings not counted so far (each logged as shed.own_stall)

    @classmethod
    def of(cls, fs: CgroupFs, plan: Plan, shed_rules: set[int]) -> OwnStall:
        """Over the plan's shedding rules (their indexes) that watch a PSI trigger."""
        triggers = {
            w.index: w.trigger
            for w in plan.watch
            if isinstance(w.trigger, WatchTrigger) and w.index in shed_rules
        }
        return cls(fs, plan.group, triggers)

    def discount(self, now: float, fired: set[int], held: list[str], *, sampled: bool) -> None:
        """Drop from ``fired`` the firings that only the ``held`` victims' own stall set off:
        they neither escalate the shed nor keep it from being given back."""
        if not self.triggers or not held:
            self.readings.clear()
            return
        if sampled:
            self.observe(now, held)
        for rule in sorted(fired):
            if self.own(now, rule, held):
                fired.discard(rule)

    def observe(self, now: float, victims: list[str]) -> None:
        """One reading (at every sample while victims are held)."""
        if not self.triggers:
            return
        totals: dict[str, dict[Key, int]] = {}
        for cgroup in (BOARD, self.group, *victims):
            got = self._read(cgroup)
            if got is not None:
                totals[cgroup] = got
        self.readings.append((now, totals))
        while self.readings and now - self.readings[0][0] > self.keep_s:
            self.readings.popleft()

    def clear(self) -> None:
        self.readings.clear()

    def own(self, now: float, rule: int, victims: list[str]) -> bool:
        """Whether this firing of ``rule`` is the held victims' own stall (see the module)."""
        trigger = self.triggers.get(rule)
        if trigger is None or not victims:
            return False
        key: Key = (trigger.resource, trigger.kind)
        window = trigger.window_us / 1e6
        old = next((r for r in reversed(self.readings) if now - r[0] >= window - 1e-6), None)
        if old is None:
            return False
        self.observe(now, victims)
        new = self.readings[-1][1]
        then, first = old[1], old[0]

        def delta(cgroup: str) -> int | None:
            a, b = then.get(cgroup, {}).get(key), new.get(cgroup, {}).get(key)
            return None if a is None or b is None else max(0, b - a)

        board, own = delta(BOARD), delta(self.group)
        parts = [delta(v) for v in victims]
        if board is None or any(p is None for p in parts):
            return False  # a victim appeared since, or a file could not be read: it counts
        threshold = trigger.stall_us * (now - first) / window
        outside = board - sum(p or 0 for p in parts)
        if outside >= threshold or (own is not None and own >= threshold):
            return False
        self.discounted += 1
        log.info(
            "shed.own_stall",
            rule=rule,
            board_us=board,
            victims_us=sum(p or 0 for p in parts),
            own_us=own,
            threshold_us=round(threshold),
            detail="the board's pressure is the held victims' own stall: not counted",
        )
        return True

    def _read(self, cgroup: str) -> dict[Key, int] | None:
        try:
            return {
                (r, kind): psi.total_us(self.fs, cgroup, f"{r}.pressure", kind)
                for r, kind in self.keys
            }
        except GovernorError:
            return None
