"""`python -m perf.governor_lru launch ...`: the governor with its evictor's order before issue
46 item 2, for perf/router.py's arm 4 only (a bench switch, no policy option: an operator has
no reason to prefer it). The evictor then unloads its idle models least recently used first
(peer/router.py idle_lru's order), whatever each costs to bring back, instead of by value
(board/order.py by_value)."""

from __future__ import annotations

from governor.main import run
from governor.supervise.evict import Evictor


def lru(self: Evictor, idle: list[str], missing: int) -> list[str]:
    """idle_lru's order unchanged: the least recently used idle model first (``missing``
    ignored)."""
    del self, missing
    return list(idle)


def main() -> None:
    """The governor's CLI with the evictor's order switched (only in this process)."""
    Evictor.by_value = lru  # type: ignore[method-assign]
    run()


if __name__ == "__main__":
    main()
