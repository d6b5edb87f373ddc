"""``signal SIG``: to the engine's processes."""

from __future__ import annotations

import signal as signal_mod

from governor.monitor.actions.base import Context, Handler, Result
from governor.plan.model import Action


class Signal(Handler):
    def run(self, action: Action, ctx: Context) -> Result:
        assert action.signal is not None
        sig = signal_mod.Signals[action.signal]
        sent = []
        for pid in list(self.env.pids()):
            try:
                self.env.kill(pid, sig)
                sent.append(pid)
            except ProcessLookupError:
                continue
        return Result(
            str(action),
            ok=bool(sent),
            after={"pids": sent},
            detail=None if sent else "no engine process",
        )
