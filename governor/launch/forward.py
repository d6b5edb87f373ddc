"""The supervisor's signal forwarding: a stop signal for the governor goes to the engine, and one
that comes before the engine runs is held, not lost (the supervisor installs it from the end
of the apply; launch/launcher.py uses it while it waits for the engine). Before that, while the
limits are written, a stop signal rolls the apply back (:func:`interruptible`: `launch` and
`apply` both)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from governor.errors import Interrupted
from governor.log import get_logger

log = get_logger(__name__)

FORWARDED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


class Forwarder:
    """The launcher's handler for FORWARDED_SIGNALS: pass them on to the running engine (none
    while a relaunch waits its backoff) and tell ``on_signal`` (the restart budget).

    ``hold``: installed before the engine exists (the supervisor installs it once the apply is
    done), a signal is held, not lost and not fatal: :meth:`engine` forwards it as soon as the
    engine runs. Without a handler there, the default action of a SIGTERM would end the
    governor between the apply and the supervision, with no report."""

    def __init__(
        self, on_signal: Callable[[int], None] | None = None, *, hold: bool = False
    ) -> None:
        self.pid: int | None = None
        self.on_signal = on_signal
        self.hold = hold
        self.held: list[int] = []

    def __call__(self, sig: int, _frame: object) -> None:
        name = signal.Signals(sig).name
        if self.pid is None and self.hold:
            self.held.append(sig)  # no log line here: the main thread may be writing one
            return
        if self.on_signal is not None:
            self.on_signal(sig)
        if self.pid is None:
            log.info("signal.received", signal=name, detail="no engine running")
            return
        try:
            os.kill(self.pid, sig)
            log.info("signal.forwarded", signal=name, pid=self.pid)
        except ProcessLookupError:
            log.info("signal.received", signal=name, detail="the engine is gone")

    def engine(self, pid: int | None) -> None:
        """The engine runs as ``pid`` (None: none runs): signals go to it from now on, the held
        ones first."""
        self.pid = pid
        if pid is None:
            return
        self.hold = False
        held, self.held = self.held, []
        for sig in held:
            log.info(
                "signal.held", signal=signal.Signals(sig).name, detail="came before the engine ran"
            )
            self(sig, None)

    @contextmanager
    def installed(self) -> Iterator[Forwarder]:
        previous = {sig: signal.signal(sig, self) for sig in FORWARDED_SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT)


@contextmanager
def interruptible() -> Iterator[None]:
    """Within the block a stop signal raises :class:`Interrupted` (a KeyboardInterrupt, so every
    ``except BaseException`` rollback runs) instead of ending the process where it stands."""

    raised: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        if raised:
            return  # the rollback of the first one is running: a second must not cut it short
        raised.append(signum)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
