"""PSI triggers (Documentation/accounting/psi.rst): arm one per fd, or fall back to polling.

A trigger is ``"<some|full> <stall us> <window us>"`` written to ``<cgroup>/<res>.pressure``
opened O_RDWR|O_NONBLOCK; the fd then polls POLLPRI at most once per window while the stall
threshold is exceeded, and POLLERR once the cgroup is gone. One trigger per fd (a second write
is EBUSY). The kernel takes windows of 500 ms..10 s, and from a caller without
CAP_SYS_RESOURCE only multiples of 2 s (kernel/sched/psi.c, psi_trigger_create: "if
(!privileged && window_us % 2000000) return -EINVAL"): root on a host without that capability
gets EINVAL for a 1 s window. :func:`arm` widens such a window once, keeping the stall share.

Where the file exists but takes no trigger (EOPNOTSUPP/EINVAL/EPERM: a kernel before 5.2, an
unprivileged window that cannot widen, a read-only delegation), the rule is evaluated from the
file's ``total=`` counter at each sample instead (:class:`PolledTrigger`, mode "polled"). Where
the file is missing or unreadable (PSI disabled: ``psi=0``, CONFIG_PSI=n) nothing can evaluate
the rule (mode "unavailable"): the compiler already refused such a policy unless ``psi`` was
allowed missing, and the plan lists the rules as degraded. The monitor logs each of these
once per file (governor/monitor/loop.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import deque
from collections.abc import Sequence
from typing import Literal

from governor.errors import BackendError, GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.log import get_logger
from governor.plan.model import WatchTrigger
from governor.record import record

log = get_logger(__name__)

# unprivileged trigger windows must be multiples of 2 s (kernel/sched/psi.c, 5.10+)
UNPRIVILEGED_WINDOW_US = 2_000_000
WINDOW_MAX_US = 10_000_000  # psi.rst: "window ... 500ms to 10s"


def widen(stall_us: int, window_us: int) -> tuple[int, int] | None:
    """The next window an unprivileged caller may arm, with the stall scaled to the same share;
    None when the window already is a 2 s multiple or cannot grow within 10 s."""
    if window_us % UNPRIVILEGED_WINDOW_US == 0:
        return None
    wider = -(-window_us // UNPRIVILEGED_WINDOW_US) * UNPRIVILEGED_WINDOW_US
    if wider > WINDOW_MAX_US:
        return None
    return min(wider, stall_us * wider // window_us), wider


Mode = Literal["trigger", "polled", "unavailable"]


@record
class Armed:
    """One rule's PSI source: a trigger fd, a :class:`PolledTrigger` on ``total=``, or none."""

    rule: int
    file: str
    kind: Literal["some", "full"]
    stall_us: int  # what the kernel (or the poller) actually uses
    window_us: int
    mode: Mode
    fd: int | None = None
    widened_from: str | None = None  # the policy's trigger text when the window was widened
    poller: PolledTrigger | None = None
    reason: str | None = None  # why there is no trigger (polled, unavailable)

    def describe(self) -> dict[str, object]:
        return {
            "rule": self.rule,
            "file": self.file,
            "trigger": f"{self.kind} {self.stall_us} {self.window_us}",
            "mode": self.mode,
            "widened_from": self.widened_from,
            "reason": self.reason,
        }


def arm(
    fs: CgroupFs, cgroup: str, rule: int, trigger: WatchTrigger, *, triggers: bool = True
) -> Armed:
    """Arm ``trigger`` on ``cgroup``; widen a refused window once; else poll ``total=``, or
    give up when the file cannot be read at all. ``triggers=False`` goes straight to polling
    (``--psi poll``, governor/monitor/loop.py)."""
    if not triggers:
        return _fallback(fs, cgroup, rule, trigger, "PSI triggers disabled (--psi poll)")
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
    return _fallback(fs, cgroup, rule, trigger, str(first))


def _fallback(fs: CgroupFs, cgroup: str, rule: int, trigger: WatchTrigger, reason: str) -> Armed:
    """Polled when the file's ``total=`` line can be read, else unavailable (why it cannot
    be read is then the reason: the refused trigger follows from it)."""
    try:
        total_us(fs, cgroup, trigger.file, trigger.kind)
    except GovernorError as err:
        return unavailable(rule, trigger, str(err))
    return polled(rule, trigger, reason)


def total_us(fs: CgroupFs, cgroup: str, file: str, kind: Literal["some", "full"]) -> int:
    """The ``total=`` of one line of a pressure file (BackendError when it has none)."""
    resource = file.split(".", 1)[0]
    p = fs.read_psi(cgroup, resource)  # type: ignore[arg-type]  # from a WatchTrigger
    line = p.some if kind == "some" else p.full
    if line is None:  # cpu.pressure before 5.13
        raise BackendError(f"no {kind!r} line in the pressure file", cgroup=cgroup, file=file)
    return line.total


def polled(rule: int, trigger: WatchTrigger, reason: str) -> Armed:
    """The fallback: evaluate the trigger from ``total=`` once per sample."""
    return Armed(
        rule,
        trigger.file,
        trigger.kind,
        trigger.stall_us,
        trigger.window_us,
        "polled",
        poller=PolledTrigger(trigger.stall_us, trigger.window_us),
        reason=reason,
    )


def unavailable(rule: int, trigger: WatchTrigger, reason: str) -> Armed:
    """No trigger and nothing to poll: the rule cannot fire."""
    return Armed(
        rule,
        trigger.file,
        trigger.kind,
        trigger.stall_us,
        trigger.window_us,
        "unavailable",
        reason=reason,
    )


class PolledTrigger:
    """The kernel's trigger rule on sampled ``total=`` readings (pure; clock passed in).

    Keeps a small ring of (time, total) samples reaching back one window. The stall within the
    last window is the growth of ``total`` since ``now - window``, the total at that instant
    interpolated linearly between the two samples around it (stall assumed even within one
    sample interval; exact at sample times). Before the ring spans a window the growth so far
    is used: a stall that already reached the threshold in less time also did within the
    window. It fires when that stall reaches ``stall_us``, at most once per window, like
    psi.c's window_update()/update_triggers(), so it reacts up to one sample later than a real
    trigger. A sample interval longer than the window dilutes the stall over the interval:
    the rule fires only when the average rate alone proves the threshold was reached.

    Bounded (issue 43 item 4): the ring holds one window of samples, and a PSI window is at
    most 10 s (the policy refuses more, as the kernel does) at one sample per 0.05 s at most
    (the sampler's floor): ~200 points.
    """

    def __init__(self, stall_us: int, window_us: int) -> None:
        self.stall_us = stall_us
        self.window_s = window_us / 1e6
        self._points: deque[tuple[float, int]] = deque()
        self._last_fire: float | None = None

    def stall_in_window(self, now: float, total_us: int) -> float | None:
        """Add a sample; the stall (us) over the last window, None before two samples."""
        pts = self._points
        if pts and total_us < pts[-1][1]:  # a counter going back: a new cgroup, start over
            pts.clear()
        pts.append((now, total_us))
        start = now - self.window_s
        # keep exactly one sample at or before the window's start (the interpolation's left end)
        while len(pts) > 2 and pts[1][0] <= start:
            pts.popleft()
        if len(pts) < 2:
            return None
        (t0, v0), (t1, v1) = pts[0], pts[1]
        if t0 >= start or t1 <= t0:
            return float(total_us - v0)
        at_start = v0 + (v1 - v0) * (start - t0) / (t1 - t0)
        return total_us - at_start

    def update(self, now: float, total_us: int) -> bool:
        stall = self.stall_in_window(now, total_us)
        if stall is None or stall < self.stall_us:
            return False
        if self._last_fire is not None and now - self._last_fire < self.window_s - 1e-9:
            return False
        self._last_fire = now
        return True


def close_trigger(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def close_triggers(fds: Sequence[int]) -> None:
    """Close PSI trigger fds side by side: each close waits for an RCU grace period
    (kernel/sched/psi.c psi_trigger_destroy: synchronize_rcu(), ~13 ms here), so N triggers
    closed one after the other cost N grace periods after the engine exited; closed in
    parallel threads, the grace periods overlap and the whole teardown costs about one."""
    if len(fds) <= 1:
        for fd in fds:
            close_trigger(fd)
        return

    threads = [threading.Thread(target=close_trigger, args=(fd,), daemon=True) for fd in fds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
