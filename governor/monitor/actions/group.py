"""``kill`` and ``restart``: the whole group, by cgroup.kill (or, on a kernel without it, the
way governor/kernel/kill.py does the same); ``restart`` then asks the launcher's relaunch
budget (restart.py). Either ends the firing: nothing is left for a later action to act on."""

from __future__ import annotations

from governor.kernel.kill import kill_tree
from governor.monitor.actions.base import Context, Handler, Result
from governor.monitor.restart import NO_SUPERVISOR
from governor.plan.model import Action


class Group(Handler):
    def run(self, action: Action, ctx: Context) -> Result:
        return self._restart(ctx) if action.verb == "restart" else self._kill()

    def ends_firing(self, action: Action, res: Result) -> bool:
        return action.verb == "kill" or res.ok

    def _kill(self) -> Result:
        before = self.env.procs()
        how = self._kill_group()
        return Result("kill", ok=True, before={"procs": before}, detail=how)

    def _kill_group(self) -> str | None:
        """None (cgroup.kill) or how the kernel without it was made to do the same."""
        env = self.env
        how = kill_tree(env.fs, env.group, env.kill, clock=env.clock)
        if env.shared.frozen_by_us:  # SIGKILL reaches frozen tasks, but thaw so they can exit
            env.fs.freeze(env.group, False)
            env.shared.thaw_at = None
            env.shared.frozen_by_us = False
        return how

    def _restart(self, ctx: Context) -> Result:
        """Kill the whole group; the launcher relaunches the engine once it has exited (also
        when it had already died: cgroup.kill of an empty group is a no-op)."""
        restarts = self.env.restarts
        if restarts is None:
            return Result("restart", ok=False, detail=NO_SUPERVISOR)
        refused = restarts.refusal()
        if refused is not None:
            return Result("restart", ok=False, detail=refused)
        before = self.env.procs()
        how = self._kill_group()
        req = restarts.request(ctx.rule, ctx.when)
        return Result(
            "restart",
            ok=True,
            detail=how,
            before={"procs": before},
            after={"attempt": req.attempt, "limit": restarts.limit, "backoff_s": req.backoff_s},
        )
