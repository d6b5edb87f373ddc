"""A bounded memo of a reader's verdicts on files another process writes, by the file's bytes.

A board scan re-reads every published state (a shed's choice of victim does at each firing,
every few seconds while the board is short) and most have not changed since the last scan;
checking each one's plan again (its types) was most of the chat supervisor's CPU beside a
growing hog (docs/benchmarks.md, "The full run"). A verdict that depends on nothing but the
bytes and the name they were published under is kept here and given again for the same bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

MAX_VERDICTS = 32  # a board's engines, twice: a few hundred bytes, not the files


class Verdicts:
    """``check()``'s result per (name, bytes), the oldest forgotten past ``size``; the bytes
    are kept as their length and hash only."""

    def __init__(self, size: int = MAX_VERDICTS) -> None:
        self.size = size
        self._seen: dict[tuple[str, int, int], str | None] = {}
        self._lock = threading.Lock()

    def get(self, name: str, raw: bytes, check: Callable[[], str | None]) -> str | None:
        key = (name, len(raw), hash(raw))
        with self._lock:
            if key in self._seen:
                return self._seen[key]
        verdict = check()
        with self._lock:
            self._seen[key] = verdict
            while len(self._seen) > self.size:
                del self._seen[next(iter(self._seen))]
        return verdict
