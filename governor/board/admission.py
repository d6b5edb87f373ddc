"""Admission's decision on the board (issue 36; its room since issue 44): weigh the new slice
against one :class:`~governor.board.scan.Board` read, then refuse, warn, wait for room or shed
lower-class slices (board/order.py picks them, board/steps.py stops them; a lower-class
router's idle models are unloaded under a lowered budget first, board/unload.py decides and
board/unloading.py does it), under the board lock
and ONE deadline for the whole admission (the lock's wait and the room's share it).

The words (a refusal's line and hint, the lock's holder) and the wiring (where the run dir, the
board file and the cgroup root are, which clock) stay with the composition root
(governor/api/admit.py); this module holds only the decision and its loop.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from governor.board.budget import (
    admit,
    forced_text,
    gib,
    holders_text,
    kept_text,
    lower,
    no_budget_text,
    overlap_text,
)
from governor.board.unload import Shed, plan, would_text
from governor.errors import GovernorError
from governor.log import get_logger
from governor.record import record
from governor.sizes import duration_text

if TYPE_CHECKING:
    from governor.board.budget import Verdict
    from governor.board.scan import Board
    from governor.board.slice import Slice
    from governor.board.unload import Room, Unload
    from governor.plan.model import QosSpec

log = get_logger("governor.admit")

POLL_S = 0.5  # "wait" and "shed": how often the board is read again


@record
class Admitted:
    """What admission decided: the board lock's fd (held until the state is published; None:
    released), the verdict and what was done for it."""

    lock_fd: int | None
    verdict: Verdict | None = None
    note: str | None = None  # for the new slice's journal: "admitted after stopping X"

    def release(self) -> None:
        """Release the board lock (once: a second call does nothing)."""
        fd, self.lock_fd = self.lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


@record(frozen=True)
class Words:
    """The composition root's words for what this module decides (api/admit.py)."""

    refuse: Callable[[Verdict, str], Exception]  # a refusal: the verdict and what follows it
    no_budget: Callable[[str], Exception]  # the reserve leaves no budget
    say: Callable[[str], None]  # one warning line


@record(frozen=True)
class Unloader:
    """The composition root's doors to a shed admission's unloads (board/unloading.py):
    ``rooms``, the lower-class routers' rooms now; ``unload``, lower one router's budget and
    unload its models, done by the admission's deadline (its second argument, on the
    admission's clock; GovernorError: not done, its budget given back); ``restore``, give a
    router's lowered budget back; ``text``, the line that says what one unload did."""

    rooms: Callable[[list[Slice]], list[Room]]
    unload: Callable[[Unload, float], None]
    restore: Callable[[Unload], None]
    text: Callable[[Unload], str]


def duration(seconds: float) -> str:
    """``admit_timeout`` as the policy spells it ("1us", "1m30s" reads "90s", "2m")."""
    return duration_text(max(1, round(seconds * 1_000_000)))


def decide(
    new: Slice,
    qos: QosSpec,
    *,
    read: Callable[[], Board],
    words: Words,
    lock: Callable[[float], int] | None,
    lock_deadline: float,
    stop: Callable[[Slice], None],
    force: bool = False,
    hold: bool = True,
    act: bool = True,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    started: float | None = None,
    unlocked: Callable[[OSError], None] | None = None,
    unloader: Unloader | None = None,
) -> Admitted:
    """Admit ``new`` (its policy's ``[qos]``) on the board ``read`` returns, or raise what
    ``words.refuse`` makes. ``lock(deadline)``: the board lock's fd (None: a board rendered
    elsewhere, nothing running: no lock, nothing started); ``hold``: keep it on return;
    ``act``: False where nothing starts now ("wait" and "shed" only say what the start will
    do); ``stop``: stop one victim (board/steps.py stop); ``unloader``: a shed's unloads of
    lower-class routers' idle models (None: a shed only stops)."""
    started = clock() if started is None else started
    fd = -1
    if lock is not None:
        try:
            fd = lock(lock_deadline)
        except OSError as err:  # an unwritable run dir: weighed all the same, unlocked
            if unlocked is not None:
                unlocked(err)
    held = _Lock(fd)
    try:
        return _decide(
            new, qos, read=read, words=words, lock=lock, held=held, stop=stop, force=force,
            hold=hold, act=act, clock=clock, sleep=sleep, started=started, unloader=unloader,
        )  # fmt: skip
    except BaseException:
        if held.fd >= 0:
            os.close(held.fd)
        raise


@record
class _Lock:
    fd: int  # the board lock's fd while the decision holds it (-1: not held)

    def give(self, hold: bool, verdict: Verdict | None, note: str | None = None) -> Admitted:
        """The decision, the lock handed over with it (``hold``) or released."""
        fd, self.fd = self.fd, -1
        if fd >= 0 and not hold:
            os.close(fd)
        return Admitted(fd if fd >= 0 and hold else None, verdict, note)


def _decide(
    new: Slice,
    qos: QosSpec,
    *,
    read: Callable[[], Board],
    words: Words,
    lock: Callable[[float], int] | None,
    held: _Lock,
    stop: Callable[[Slice], None],
    force: bool,
    hold: bool,
    act: bool,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    started: float,
    unloader: Unloader | None = None,
) -> Admitted:
    say = words.say
    seen = read()
    for p in seen.notes:
        log.debug("admit.skipped", problem=p)  # status and `check` say what is wrong
    if seen.budget.memtotal <= 0:  # no MemTotal (a fixture root): nothing to weigh
        log.warning("admit.no_memtotal", detail="admitted unweighed")
        return held.give(hold, None)
    none = no_budget_text(seen.budget)
    if none is not None:  # no room will ever come: the board file is wrong (check says so)
        if not force:
            raise words.no_budget(none)
        say(f"admitted by --force: {none}")
        return held.give(hold, None)
    verdict = admit(seen.budget, new, seen.slices)
    if verdict.fits:
        return held.give(hold, verdict)
    if force:
        say(f"admitted by --force: {forced_text(verdict)}")
        return held.give(hold, verdict)
    mode = qos.admit
    if mode == "warn" and verdict.kind == "peaks":
        say(f"admitted with an overlap: {overlap_text(verdict)}")
        return held.give(hold, verdict)
    if mode in ("warn", "refuse"):
        raise words.refuse(verdict, "")
    if not act or lock is None:
        would = ""
        if mode == "shed":  # the unloads it would make, from the figures the start will use
            shed = shed_plan(
                new, verdict, seen.slices, None if unloader is None else unloader.rooms
            )
            if not shed.enough:  # the start would refuse at once (75): `check` says so too
                raise words.refuse(verdict, _short(verdict))
            would = f"; the shed would {would_text(shed)}" if shed.unloads else ""
        say(f"at its start {new.name} will {mode} for room: {overlap_text(verdict)}{would}")
        return held.give(hold, verdict)
    note = None
    done: list[Unload] = []
    if mode == "shed":
        # decided before anyone is unloaded or stopped (board/unload.py): an unload counts
        # only with its router's budget lowered, a victim only when its stop removes its claim
        shed = shed_plan(new, verdict, seen.slices, None if unloader is None else unloader.rooms)
        if not shed.enough:
            raise words.refuse(verdict, _short(verdict))
        for u in shed.unloads:
            doors = unloader
            assert doors is not None  # only an unloader offers rooms (shed_plan)
            try:
                doors.unload(u, started + qos.admit_timeout_s)
            except GovernorError as err:  # nothing half-applied: every lowered budget back
                _restore(doors, done)
                raise words.refuse(verdict, f", and {err}") from None
            done.append(u)
            say(f"admission of {new.name} {doors.text(u)}")
        names = ", ".join(v.name for v in shed.stops)
        if shed.stops:
            say(f"admission of {new.name} stops {names} (a lower class) to make room")
        for victim in shed.stops:
            stop(victim)
        note = _note(shed)
    else:
        if not verdict.can_wait:  # never a wait for room that cannot come (issue 46 item 4)
            raise words.refuse(
                verdict,
                ", and no wait can make room: no slice whose stop frees its claim holds enough",
            )
        say(
            f"waiting up to {duration(qos.admit_timeout_s)} for {gib(verdict.missing)}"
            f" of room for {new.name} ({holders_text(verdict)})"
        )
    try:
        return _room(new, mode, qos, read=read, words=words, lock=lock, held=held, hold=hold,
                     clock=clock, sleep=sleep, started=started, note=note)  # fmt: skip
    except BaseException:  # refused after all: the lowered budgets are given back
        _restore(unloader, done)
        raise


def _short(verdict: Verdict) -> str:
    """What a shed that cannot make room adds to the refusal (the start's and `check`'s)."""
    return f", and no lower class to shed frees enough{kept_text(verdict)}"


def shed_plan(
    new: Slice,
    verdict: Verdict,
    slices: tuple[Slice, ...],
    rooms: Callable[[list[Slice]], list[Room]] | None,
) -> Shed:
    """What a shed admission does (board/unload.py plan): unloads first where a lower-class
    router can hold a lowered budget (``rooms``: what those routers hold now, None: no
    unloads), then stops. The one decision a start makes and `check`, `install` and `board
    --fits` say."""
    stoppable = lower(new, tuple(c for c in slices if c.name != new.name))
    routers = [
        c for c in slices
        if c.name != new.name and c.state == "running" and c.qos.rank < new.qos.rank and c.evicts
        and "unload" in c.yields
    ]  # fmt: skip
    if rooms is None or not routers or verdict.need[0] > 0:
        return Shed((), verdict.victims, verdict.enough)
    return plan(verdict.need, stoppable, rooms(routers))


def _restore(unloader: Unloader | None, done: list[Unload]) -> None:
    for u in reversed(done):
        if unloader is not None:
            unloader.restore(u)
    done.clear()


def _note(shed: Shed) -> str:
    """The admitted slice's journal: why it runs."""
    parts = [f"unloading {', '.join(u.models)} from {u.router.name}" for u in shed.unloads] + (
        [f"stopping {', '.join(v.name for v in shed.stops)}"] if shed.stops else []
    )
    return f"admitted after {' and '.join(parts)} (a lower class)"


def _room(
    new: Slice,
    mode: str,
    qos: QosSpec,
    *,
    read: Callable[[], Board],
    words: Words,
    lock: Callable[[float], int] | None,
    held: _Lock,
    hold: bool,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    started: float,
    note: str | None,
) -> Admitted:
    """Wait (or let the victims go) until the board has room, at most admit_timeout."""
    deadline = started + qos.admit_timeout_s
    locked = held.fd >= 0
    while True:  # wait (or let the victims go) without the lock: they may need it
        if locked:
            os.close(held.fd)
            held.fd = -1
        sleep(POLL_S)
        if locked and lock is not None:
            held.fd = lock(deadline)
        seen = read()
        verdict = admit(seen.budget, new, seen.slices)
        if verdict.fits:
            if note is None:
                note = "admitted after waiting for room"
            words.say(f"{new.name} admitted: {note}")
            return held.give(hold, verdict, note)
        if clock() >= deadline:
            raise words.refuse(verdict, f", after {duration(qos.admit_timeout_s)} of {mode}")
