"""The only structlog configuration: JSON lines on stderr when stderr is not a TTY (journal,
CI, pipes), ``event key=value`` lines on a TTY. Library modules only call get_logger()."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
