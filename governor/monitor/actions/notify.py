"""``log``: the firing, told in the monitor's log (the executor's ``action.done`` line)."""

from __future__ import annotations

from governor.monitor.actions.base import Context, Handler, Result
from governor.plan.model import Action


class Log(Handler):
    def run(self, action: Action, ctx: Context) -> Result:
        return Result("log", ok=True, detail=f"value={ctx.value} active_s={ctx.active_s:.2f}")
