"""`governor init` beside what earlier runs measured (issue 45 item 3): the peak governed runs
of this model and engine command line reached (governor/state/peaks.py) is shown beside the
formula's total, and memory.max/high are sized from it when it is the higher of the two (the
formula under-estimates there; a lower measured peak leaves the formula's sizing alone: a short
run may not have filled the context)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from governor.engines.budget import headroom_for
from governor.engines.estimate import MIB
from governor.init.sizing import Sizing

# the composition root's lookup (governor/api/compile.py): an engine command line -> (peak,
# runs) its earlier governed runs measured, None when none did
Measured = Callable[[Sequence[str]], "tuple[int, int] | None"]


def with_measured(s: Sizing, engine: Sequence[str], measured: Measured | None) -> Sizing:
    """``s`` with the measured peak of ``engine`` (none: ``s`` unchanged)."""
    got = None if measured is None else measured(engine)
    if got is None:
        return s
    peak, _runs = got
    est = replace(s.est, measured=got)
    if peak <= s.est.total:
        return replace(s, est=est)
    headroom = headroom_for(peak)
    return replace(
        s,
        est=est,
        headroom=headroom,
        mem_high=-(-(peak + headroom // 2) // MIB) * MIB,
        mem_max=-(-(peak + headroom) // MIB) * MIB,
    )


def lines(s: Sizing, width: int) -> list[str]:
    """The head comment's line for the measured peak (none: no line)."""
    if s.est.measured is None:
        return []
    peak, runs = s.est.measured
    sized = "memory.max is sized from it" if peak > s.est.total else "the formula sizes memory.max"
    return [
        f"#   {'peak':<{width}}{peak / MIB:8.1f} MiB  (measured, {runs} run"
        f"{'s' * (runs != 1)} of this command line: {sized})"
    ]
