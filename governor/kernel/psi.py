"""PSI triggers (Documentation/accounting/psi.rst): arm one per fd, or fall back to polling.

A trigger is ``"<some|full> <stall us> <window us>"`` written to ``<cgroup>/<res>.pressure``
opened O_RDWR|O_NONBLOCK; the fd then polls POLLPRI at most once per window while the stall
threshold is exceeded, and POLLERR once the cgroup is gone. One trigger per fd (a second write
is EBUSY). The kernel takes windows of 500 ms..10 s, and from a caller without
CAP_SYS_RESOURCE only multiples of 2 s (kernel/sched/psi.c, psi_trigger_create: "if
(!privileged && window_us % 2000000) return -EINVAL"): root on a host without that capability
gets EINVAL for a 1 s window. :func:`arm` widens such a window once, keeping the stall share,
and polls the ``total=`` counter when no trigger can be armed at all.
"""

from __future__ import annotations

import errno
from collections import deque
from dataclasses import dataclass
from typing import Literal

import structlog

from governor.errors import GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.plan.model import WatchTrigger

log = structlog.get_logger(__name__)

# unprivileged trigger windows must be multiples of 2 s (kernel/sched/psi.c, 5.10+)
UNPRIVILEGED_WINDOW_US = 2_000_000
WINDOW_MAX_US = 10_000_000  # psi.rst: "window ... 500ms to 10s"
# errnos that mean "no trigger here" (PSI off: EOPNOTSUPP; psi=0 or !CONFIG_PSI: ENOENT)
_NO_TRIGGER = (errno.EOPNOTSUPP, errno.ENOENT, errno.EINVAL, errno.EACCES, errno.EPERM)


def widen(stall_us: int, window_us: int) -> tuple[int, int] | None:
    """The next window an unprivileged caller may arm, with the stall scaled to the same share;
    None when the window already is a 2 s multiple or cannot grow within 10 s."""
    if window_us % UNPRIVILEGED_WINDOW_US == 0:
        return None
    wider = -(-window_us // UNPRIVILEGED_WINDOW_US) * UNPRIVILEGED_WINDOW_US
    if wider > WINDOW_MAX_US:
        return None
    return min(wider, stall_us * wider // window_us), wider


@dataclass
class Armed:
    """One rule's PSI source: a trigger fd, or a :class:`PolledTrigger` on ``total=``."""

    rule: int
    file: str
    kind: Literal["some", "full"]
    stall_us: int  # what the kernel (or the poller) actually uses
    window_us: int
    mode: Literal["trigger", "polled"]
    fd: int | None = None
    widened_from: str | None = None  # the policy's trigger text when the window was widened
    poller: PolledTrigger | None = None

    def describe(self) -> dict[str, object]:
        return {
            "rule": self.rule,
            "file": self.file,
            "trigger": f"{self.kind} {self.stall_us} {self.window_us}",
            "mode": self.mode,
            "widened_from": self.widened_from,
        }


def arm(fs: CgroupFs, cgroup: str, rule: int, trigger: WatchTrigger) -> Armed:
    """Arm ``trigger`` on ``cgroup``; widen a refused window once; else fall back to polling."""
    text = trigger.trigger_text()
    try:
        fd = fs.open_trigger(cgroup, trigger.file, text)
        return Armed(
            rule, trigger.file, trigger.kind, trigger.stall_us, trigger.window_us, "trigger", fd
        )
    except GovernorError as err:
        code = getattr(err, "errno", None)
        first = err
    wider = widen(trigger.stall_us, trigger.window_us) if code == errno.EINVAL else None
    if wider is not None:
        stall, window = wider
        try:
            fd = fs.open_trigger(cgroup, trigger.file, f"{trigger.kind} {stall} {window}")
        except GovernorError as err:
            first = err
        else:
            log.warning(
                "psi.widened",
                rule=rule,
                file=trigger.file,
                asked=text,
                armed=f"{trigger.kind} {stall} {window}",
                reason="window must be a multiple of 2s without CAP_SYS_RESOURCE",
            )
            return Armed(rule, trigger.file, trigger.kind, stall, window, "trigger", fd, text)
    return polled(rule, trigger, str(first))


def polled(rule: int, trigger: WatchTrigger, reason: str) -> Armed:
    """The fallback: poll ``total=`` once per sample (logged once per rule)."""
    log.warning(
        "psi.polled",
        rule=rule,
        file=trigger.file,
        trigger=trigger.trigger_text(),
        reason=reason,
        detail="no PSI trigger: polling the total= counter once per sample instead",
    )
    return Armed(
        rule,
        trigger.file,
        trigger.kind,
        trigger.stall_us,
        trigger.window_us,
        "polled",
        poller=PolledTrigger(trigger.stall_us, trigger.window_us),
    )


class PolledTrigger:
    """The kernel's trigger rule on polled ``total=`` readings (pure; clock passed in).

    Fires when the stall grew by ``stall_us`` within the last ``window_us``, at most once per
    window, like psi.c's window_update()/update_triggers(). Readings come once per sample
    (1 s by default), so it reacts up to one sample later than a real trigger.
    """

    def __init__(self, stall_us: int, window_us: int) -> None:
        self.stall_us = stall_us
        self.window_s = window_us / 1e6
        self._points: deque[tuple[float, int]] = deque()
        self._last_fire: float | None = None

    def update(self, now: float, total_us: int) -> bool:
        self._points.append((now, total_us))
        while len(self._points) > 1 and now - self._points[1][0] >= self.window_s:
            self._points.popleft()
        oldest_t, oldest_total = self._points[0]
        if now - oldest_t > self.window_s * 1.5:  # a gap in readings: start over
            self._points = deque([(now, total_us)])
            return False
        if total_us - oldest_total < self.stall_us:
            return False
        if self._last_fire is not None and now - self._last_fire < self.window_s:
            return False
        self._last_fire = now
        return True
