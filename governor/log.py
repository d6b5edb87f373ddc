"""Structured logs without a logging framework: one JSON object per line on stderr when stderr
is not a TTY (journal, CI, pipes), ``event='x' key=value`` lines on a TTY.

The run time (supervisor, launcher, monitor) imports this and the standard library only; a
framework (structlog pulls asyncio and ssl: 30-40 ms per start here) costs a 2 GB board more
than it gives. Event names are constant and dotted (``cgroup.write``, ``psi.armed``), values
are fields; the line format is the one the wave-1 structlog setup wrote (``event`` first,
then the fields, ``level``, ``timestamp`` in UTC ISO 8601 with a ``Z``), so journal queries
keep working. Library modules call ``get_logger()``; only the CLI calls ``configure()``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class _Config:
    threshold = _LEVELS["info"]
    use_json: bool | None = None  # None: decide per line from sys.stderr.isatty()
    captured: list[dict[str, Any]] | None = None  # capture_logs() in tests


_CONFIG = _Config()


def configure(*, debug: bool = False, json: bool | None = None) -> None:
    """Level and format for every logger (the CLI calls this once)."""
    _CONFIG.threshold = _LEVELS["debug" if debug else "info"]
    _CONFIG.use_json = json


def _timestamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def _emit(level: str, event: str, fields: dict[str, Any]) -> None:
    if _CONFIG.captured is not None:
        _CONFIG.captured.append({"event": event, **fields, "log_level": level})
        return
    if _LEVELS[level] < _CONFIG.threshold:
        return
    record = {"event": event, **fields, "level": level, "timestamp": _timestamp()}
    err = sys.stderr  # whatever it is now: tests and a daemonised watchdog replace or close it
    try:
        use_json = _CONFIG.use_json if _CONFIG.use_json is not None else not err.isatty()
        if use_json:
            line = json.dumps(record, default=str)
        else:
            line = " ".join(f"{k}={v!r}" for k, v in record.items() if k != "level")
        err.write(line + "\n")
        err.flush()
    except (OSError, ValueError, AttributeError, RuntimeError):
        # nowhere to log to, or a line from a signal handler while the main thread was
        # writing one (RuntimeError: reentrant call): never let logging break the governor
        pass


class Logger:
    """``log.info("engine.started", pid=123)``: an event name and its fields."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def debug(self, event: str, **fields: Any) -> None:
        _emit("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        _emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        _emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        _emit("error", event, fields)


def get_logger(name: str = "governor") -> Logger:
    return Logger(name)


@contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """Collect every event (all levels) as dicts with ``event`` and ``log_level`` (tests)."""
    previous = _CONFIG.captured
    out: list[dict[str, Any]] = []
    _CONFIG.captured = out
    try:
        yield out
    finally:
        _CONFIG.captured = previous
