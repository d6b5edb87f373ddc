"""``freeze DURATION`` and ``thaw``: cgroup.freeze, waited for in cgroup.events, thawed by
itself when the duration is over (this handler's timer) and when the monitor stops. A freeze a
higher class's shed holds on this slice (its journal) is never thawed here."""

from __future__ import annotations

import os
import select
from collections.abc import Callable

from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.parse import parse_flat_keyed
from governor.monitor.actions.base import Context, Handler, Result, Ticked
from governor.plan.model import Action

FREEZE_WAIT_S = 5.0  # how long to wait for cgroup.events "frozen 1"
THAW = Action(verb="thaw", text="thaw")


class Freeze(Handler):
    def run(self, action: Action, ctx: Context) -> Result:
        return self._freeze(action) if action.verb == "freeze" else self._thaw()

    def deadline(self) -> float | None:
        return self.env.shared.thaw_at

    def tick(self, now: float, quiet: Callable[[float], bool]) -> Ticked | None:
        """The automatic thaw of a timed freeze, once its time has come."""
        if self.env.shared.thaw_at is None or now < self.env.shared.thaw_at:
            return None
        self.env.shared.thaw_at = None
        return Ticked(self._execute(THAW, "freeze expired"), "freeze expired")

    def close(self, why: str) -> None:
        if self.env.shared.thaw_at is not None:  # never leave a group frozen behind
            self._execute(THAW, why)

    def _execute(self, action: Action, when: str) -> Result:
        ctx = Context(rule=-1, when=when)
        return (
            self.env.shared.execute(action, ctx)
            if self.env.shared.execute
            else self.run(action, ctx)
        )

    def _freeze(self, action: Action) -> Result:
        assert action.duration_s is not None
        env = self.env
        before = self._frozen()
        env.fs.freeze(env.group, True)
        t0 = env.clock()
        frozen = self._wait_frozen(True)
        env.shared.frozen_by_us = True
        env.shared.thaw_at = env.clock() + action.duration_s
        return Result(
            str(action),
            ok=frozen,
            before={"frozen": before},
            after={"frozen": int(frozen), "wait_s": round(env.clock() - t0, 3)},
            detail=None if frozen else f"cgroup.events not 'frozen 1' after {FREEZE_WAIT_S}s",
        )

    def _thaw(self) -> Result:
        env = self.env
        with env.journal_locked():
            hold = env.shed_hold()
            if hold is not None and hold.frozen:
                env.shared.thaw_at = None
                env.shared.frozen_by_us = False
                return Result("thaw", ok=True, detail=f"kept frozen: shed by {hold.by}")
            before = self._frozen()
            env.fs.freeze(env.group, False)
        env.shared.thaw_at = None
        env.shared.frozen_by_us = False
        thawed = self._wait_frozen(False)
        return Result(
            "thaw", ok=thawed, before={"frozen": before}, after={"frozen": int(not thawed)}
        )

    def _frozen(self) -> int | None:
        try:
            return self.env.fs.events(self.env.group).get("frozen")
        except GovernorError:
            return None

    def _wait_frozen(self, want: bool) -> bool:
        """Wait until cgroup.events says ``frozen <want>``: poll() on the file for its
        modified notification (POLLPRI), re-reading after each wake-up."""
        env = self.env
        deadline = env.clock() + FREEZE_WAIT_S
        fd = env.fs.open_watch(env.group, kf.CGROUP_EVENTS)
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
            while True:
                text = os.pread(fd, 4096, 0).decode()
                if parse_flat_keyed(text).get("frozen", 0) == int(want):
                    return True
                left = deadline - env.clock()
                if left <= 0:
                    return False
                poller.poll(min(left, 0.5) * 1000)
        finally:
            os.close(fd)
