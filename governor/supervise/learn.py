"""What a governed run teaches the estimate (issue 45 item 3): its measured peak, recorded at the
engine's exit under the key launch computed (``extra["peak_key"]``: governor/state/peaks.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from governor.launch.launcher import LaunchReport
from governor.log import get_logger
from governor.state.peaks import LockBusy, record_peak
from governor.state.store import state_dir

log = get_logger("governor.supervise")


def measured_peak(report: LaunchReport) -> int | None:
    """The run's measured peak: memory.peak, else the sampler's (the group's peak, then the
    highest memory.current); None when the run hit its limit (an OOM kill or memory.max
    events: its peak is the limit's, not the engine's need) or nothing was measured."""
    if report.oom_kill or report.oom_group_kill or report.memory_events_max:
        return None
    sampler = (report.extra.get("monitor") or {}).get("sampler") or {}
    for value in (report.memory_peak, sampler.get("peak"), sampler.get("max_current")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def learn_peak(extra: dict[str, Any], report: LaunchReport, directory: Path | None = None) -> None:
    """Record the run's measured peak under its key in ``directory``'s store (None: the state
    directory, state/store.py state_dir); the first time the learned peak is far from the
    formula's, say so once (a warning, and ``far`` in the report's ``learned``)."""
    key = extra.get("peak_key")
    peak = measured_peak(report)
    if not isinstance(key, str) or peak is None:
        return
    total = (extra.get("estimate") or {}).get("total")
    estimate = total if isinstance(total, int) and total > 0 else None
    try:
        got, far = record_peak(directory or state_dir(), key, peak, estimate)
    except (OSError, LockBusy) as err:
        log.warning("peak.unrecorded", peak=peak, error=str(err))
        return
    report.extra["learned"] = {**got.to_json(), **({"far": far} if far else {})}
    log.info("peak.learned", peak=got.peak, runs=got.runs, estimate=got.estimate)
    if far is not None:
        log.warning("estimate.far", message=far)
