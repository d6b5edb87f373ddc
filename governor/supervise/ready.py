"""Ready means ready: an engine that serves (llama-server) is ready when its health endpoint
answers 200, not when it was exec'd. While the model loads llama-server's /health answers 503.

The supervisor sends READY=1 to systemd (Type=notify) only then, so `systemctl start
governor@chat` returns once the server can answer, and a unit ordered After= it talks to a
server that is up. A server that does not answer 200 within the policy's ``ready_timeout`` is
stopped and the launch fails (69). Standard library only (the run time's import set): one
exchange of governor/peer/http.py per probe (its deadline covers the whole request).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from governor.errors import HostError
from governor.peer import http
from governor.plan.llama_args import unreachable
from governor.record import record

PROBE_INTERVAL_S = 0.25
PROBE_TIMEOUT_S = 2.0
# a never-ready engine gets SIGTERM, and SIGKILL if it is still there this much later
STOP_GRACE_S = 10.0


class EngineNotReady(HostError):
    """The engine never answered 200 on its ready URL within the timeout (69)."""


@record(frozen=True)
class Endpoint:
    host: str
    port: int
    path: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path}"


def parse(url: str) -> Endpoint:
    """An http://HOST:PORT/PATH URL (validated by the policy model) as an endpoint."""

    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"not an http://HOST:PORT URL: {url!r}")
    return Endpoint(parts.hostname, parts.port, parts.path or "/")


def server_url(host: str | None, port: int | None) -> str | None:
    """llama-server's health URL from its --host/--port (defaults 127.0.0.1:8080); a wildcard
    listen address is probed on loopback. --host is a comma-separated list whose ``.sock``
    entries are UNIX sockets (tools/server): the first TCP address is probed. None when the
    address cannot be known (:func:`unreachable`): nothing is probed then."""
    if unreachable(host, port) is not None:
        return None
    tcp = [a.strip() for a in (host or "").split(",") if a.strip()]
    h = next((a for a in tcp if not a.endswith(".sock")), "127.0.0.1")
    if h in ("0.0.0.0", ""):
        h = "127.0.0.1"
    elif h == "::":
        h = "::1"
    return Endpoint(h, port or 8080, "/health").url


def probe(ep: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> int | None:
    """The HTTP status the endpoint answers within ``timeout`` in all (governor/peer/http.py:
    a server that trickles its answer is no answer), None when nothing answers."""
    try:
        return http.exchange(
            ep.host, ep.port, "GET", ep.path, deadline_s=timeout, read_body=False
        ).status
    except http.HttpError:
        return None


class ReadyWait:
    """Probe ``ep`` in a thread until it answers 200 (then ``on_ready()``), or until
    ``timeout_s`` passed (then ``on_timeout(why)``), or :meth:`stop`."""

    def __init__(
        self,
        ep: Endpoint,
        timeout_s: float,
        *,
        on_ready: Callable[[float], None],
        on_timeout: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self.ep, self.timeout_s = ep, timeout_s
        self.on_ready, self.on_timeout = on_ready, on_timeout
        self.clock, self.interval_s = clock, interval_s
        self.last_status: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ready-wait", daemon=True)

    def start(self) -> ReadyWait:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=PROBE_TIMEOUT_S + 1)

    def _run(self) -> None:
        start = self.clock()
        while not self._stop.is_set():
            status = self.last_status = probe(self.ep)
            waited = self.clock() - start
            if status == 200:
                self.on_ready(waited)
                return
            if waited >= self.timeout_s:
                said = f"answered {status}" if status is not None else "did not answer"
                self.on_timeout(
                    f"{self.ep.url} {said} within {self.timeout_s:g}s (engine.ready_timeout)"
                )
                return
            self._stop.wait(self.interval_s)


def stop_engine(pid: int, grace_s: float = STOP_GRACE_S) -> str:
    """Stop a never-ready engine: SIGTERM, then SIGKILL when it has not exited ``grace_s``
    later (one that ignores SIGTERM must not keep the supervisor waiting). Through a pidfd, so
    a pid reused after the engine was reaped is never signalled. Returns what was sent."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "already gone"
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)  # readable once the process has exited
        if poller.poll(grace_s * 1000):
            return "SIGTERM"
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return f"SIGTERM, SIGKILL after {grace_s:g}s"
    except ProcessLookupError:
        return "SIGTERM"
    finally:
        os.close(pidfd)
