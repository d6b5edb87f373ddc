"""The only structlog configuration: JSON lines on stderr when stderr is not a TTY (journal,
CI, pipes), ``event key=value`` lines on a TTY. Library modules only call get_logger()."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


class _Stderr:
    """Writes to whatever sys.stderr is at the time of the call (not at configure time), so
    a replaced or closed stream (tests, daemonised watchdog) never breaks logging."""

    def msg(self, message: str) -> None:
        try:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # nowhere to log to: never let logging break the governor

    debug = info = warning = warn = error = critical = exception = fatal = failure = err = msg


def _stderr_factory(*_args: Any) -> _Stderr:
    return _Stderr()


def configure(*, debug: bool = False, json: bool | None = None) -> None:
    use_json = not sys.stderr.isatty() if json is None else json
    renderer: Any = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if use_json
        else structlog.processors.KeyValueRenderer(key_order=["event"], drop_missing=True)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.DEBUG if debug else logging.INFO
        ),
        logger_factory=_stderr_factory,
        cache_logger_on_first_use=True,
    )
