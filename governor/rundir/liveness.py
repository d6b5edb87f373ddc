"""Whether a process that published something still runs (issue 43 item 6): a supervisor is
named by its pid AND its start time (``/proc/PID/stat`` starttime, which its state records as
``pid_start``: a reused pid starts later). Without a start time (a state written before issue
43, the --confirm reverter, a shed's holder) the command line must hold a marker ("governor").
governor/rundir/state.py is_stale asks it for every published state."""

from __future__ import annotations

import os
from pathlib import Path

from governor.kernel.procfs import ProcFs


def alive(
    pid: int | None,
    proc: Path = Path("/proc"),
    *,
    marker: bytes = b"governor",
    start: int | None = None,
) -> bool:
    """``pid`` runs and is the process that published it: it started at ``start`` (its
    /proc/PID/stat starttime, recorded when it published; a reused pid started later), else
    (a state of before issue 43, a reverter) its command line has ``marker``."""
    if not pid:
        return False
    if start is not None:
        return started(pid, start, proc)
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return marker in cmdline


def started(pid: int | None, start: int, proc: Path = Path("/proc")) -> bool:
    """``pid`` runs and started at ``start`` (its /proc/PID/stat starttime)."""
    if not pid:
        return False
    try:
        return ProcFs(proc).starttime(pid) == start
    except (OSError, ValueError):
        return False


_OWN_START: dict[int, int | None] = {}


def own_start() -> int | None:
    """This process's start time (:func:`alive`'s ``start``) for the state it publishes; read
    once per process (None when /proc cannot say)."""
    pid = os.getpid()
    if pid not in _OWN_START:
        try:
            _OWN_START[pid] = ProcFs().starttime(pid)
        except (OSError, ValueError):
            _OWN_START[pid] = None
    return _OWN_START[pid]


REVERTER = b"governor.operate.confirm"  # the --confirm reverter's command line (governor/operate/confirm.py)
