"""Where the metrics go: an HTTP /metrics endpoint beside a running supervisor
(`governor launch/monitor --metrics [ADDR:]PORT`), or one textfile for node_exporter's textfile
collector (`governor metrics --textfile DIR`). prometheus_client writes the exposition.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest, start_http_server, write_to_textfile

from governor.errors import GovernorError, HostError, PermissionDenied, PolicyNotFound
from governor.metrics.collector import registry
from governor.metrics.listen import url
from governor.rundir.state import states_of

TEXTFILE = "governor.prom"


class Endpoint:
    """A /metrics server in a daemon thread; ``close()`` stops it and frees the port."""

    def __init__(
        self, host: str, port: int, states: Callable[[], Sequence[dict[str, Any]]], run: Path
    ) -> None:
        try:
            self.server, self.thread = start_http_server(port, host, registry(states, run))
        except OSError as err:
            raise _bind_error(host, port, err) from err
        self.host = host
        self.port = int(self.server.server_port)
        self._closed = threading.Event()

    @property
    def url(self) -> str:
        return url(self.host, self.port)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def _bind_error(host: str, port: int, err: OSError) -> GovernorError:
    where = f"--metrics, {url(host, port)}"
    if err.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(
            f"cannot listen for metrics at {url(host, port)}",
            errno=err.errno,
            hint="ports below 1024 need root or CAP_NET_BIND_SERVICE; use e.g. 9101",
        )
    reason = err.strerror or str(err)
    hint = (
        "another process listens there (ss -ltnp); pick another port"
        if err.errno == errno.EADDRINUSE
        else "give an address of this host, e.g. --metrics 127.0.0.1:9101"
    )
    return HostError(f"cannot listen for metrics: {reason} ({where})", hint=hint)


def serve(
    host: str, port: int, states: Callable[[], Sequence[dict[str, Any]]], run: Path
) -> Endpoint:
    """Bind now (a busy port fails before anything is applied) and serve from a thread."""
    return Endpoint(host, port, states, run)


def _states(run: Path, name: str | None) -> list[dict[str, Any]]:
    return states_of(run, name, hint="`governor status` lists what runs")


def exposition(run: Path, name: str | None = None) -> bytes:
    """The text exposition of every governed slice (or ``name``), as a scrape would get it."""

    states = _states(run, name)
    return generate_latest(registry(lambda: states, run))


def write_textfile(directory: Path, run: Path, name: str | None = None) -> Path:
    """``DIR/governor.prom`` for every governed slice (or ``name``), replaced atomically
    (prometheus_client.write_to_textfile: a temporary file in DIR, then rename)."""
    states = _states(run, name)
    return write_registry(directory, TEXTFILE, registry(lambda: states, run), "--textfile")


def write_registry(directory: Path, filename: str, reg: Any, option: str) -> Path:
    """Write ``reg`` as ``directory/filename`` for node_exporter's textfile collector, atomically;
    the one-line errors name ``option`` (governor metrics --textfile, bench --metrics-textfile)."""
    if not directory.is_dir():
        raise PolicyNotFound(
            f"no such directory: {directory} ({option})",
            hint="create it, or give node_exporter's --collector.textfile.directory",
        )
    path = directory / filename
    try:
        write_to_textfile(str(path), reg)
    except PermissionError as err:
        raise PermissionDenied(
            f"cannot write {path.name}", file=str(path), errno=err.errno, hint="run as root"
        ) from err
    except OSError as err:
        raise HostError(
            f"cannot write {path.name}: {err.strerror or err} ({path})",
            hint="check the directory's file system (full? read-only?)",
        ) from err
    return path
