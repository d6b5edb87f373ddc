"""The `restart` action's budget: how many relaunches are left, how long to wait, and whether
the operator asked the governor to stop.

The monitor's executor asks :meth:`Restarts.refusal` before it kills the group and records the
request with :meth:`Restarts.request` after; the launcher, once the engine has exited, takes
the pending request (:meth:`Restarts.take`), records it for the report (:meth:`Restarts.record`),
waits its backoff and starts the engine again in the same leaf. Pure state, no I/O: the clock
and the waiting belong to the launcher.

The wait doubles with each relaunch and is capped at :data:`BACKOFF_CAP_S`, the way systemd's
RestartSteps=/RestartMaxDelaySec= grow it: a crash loop slows down instead of hammering the
board. A terminating signal from the operator (forwarded to the engine by the launcher) ends
the loop for good: Ctrl-C is never answered with a relaunch.
"""

from __future__ import annotations

import signal
from typing import Any

from governor.record import field, record

BACKOFF_CAP_S = 60.0
# signals that mean "stop" when the governor forwards them; SIGUSR1/2 are messages, not stops
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})
# attach mode (`governor monitor`) has no engine of its own to start again
NO_SUPERVISOR = "restart needs governor launch; under systemd use Restart=on-failure"


def backoff_s(base_s: float, attempt: int, cap_s: float = BACKOFF_CAP_S) -> float:
    """The wait before relaunch number ``attempt`` (1-based): base, 2*base, 4*base ... <= cap."""
    if attempt < 1:
        raise ValueError(f"restart attempt must be 1 or more, got {attempt}")
    # the exponent is bounded so a huge attempt number cannot overflow the float
    return min(base_s * 2.0 ** min(attempt - 1, 64), cap_s)


@record(frozen=True)
class Request:
    """A relaunch the monitor asked for (the group was killed to get it)."""

    attempt: int
    rule: int
    when: str
    backoff_s: float


@record
class Restarts:
    limit: int  # process.restart_max
    base_s: float  # process.restart_backoff
    pending: Request | None = None
    stopped_by: str | None = None  # the operator's signal that ended the loop
    history: list[dict[str, Any]] = field(default_factory=list)  # LaunchReport extra["restarts"]

    @property
    def done(self) -> int:
        return len(self.history)

    def refusal(self) -> str | None:
        """Why a restart cannot be requested now, or None when it can."""
        if self.stopped_by is not None:
            return f"the governor was asked to stop ({self.stopped_by}); no relaunch"
        if self.pending is None and self.done >= self.limit:
            return f"restart limit {self.limit} reached"
        return None

    def request(self, rule: int, when: str) -> Request:
        """Record a relaunch; a second rule asking before the engine is back joins the first."""
        reason = self.refusal()
        if reason is not None:
            raise ValueError(reason)
        if self.pending is None:
            attempt = self.done + 1
            self.pending = Request(attempt, rule, when, backoff_s(self.base_s, attempt))
        return self.pending

    def on_signal(self, sig: int) -> None:
        """A signal the launcher forwarded: a terminating one cancels any relaunch."""
        if sig in STOP_SIGNALS and self.stopped_by is None:
            self.stopped_by = signal.Signals(sig).name
            self.pending = None

    def take(self) -> Request | None:
        """After the engine exited: the pending relaunch, or None (none asked, or stopped)."""
        req, self.pending = self.pending, None
        return None if self.stopped_by is not None else req

    def record(self, req: Request, *, exit_code: int, sig: int | None) -> dict[str, Any]:
        """The report's entry for a relaunch, with the status of the run it replaces; the
        launcher adds ``cancelled`` or ``error`` when the relaunch did not happen."""
        entry: dict[str, Any] = {
            "attempt": req.attempt,
            "rule": req.rule,
            "when": req.when,
            "backoff_s": req.backoff_s,
            "exit_code": exit_code,
            "signal": sig,
            "signal_name": signal.Signals(sig).name if sig else None,
        }
        self.history.append(entry)
        return entry
