"""Operating a live board, in the composition root: `status`, `metrics`, `rollback` (and the
run they act on); `tune` and `diff` compile, in api/tune.py and api/diff.py. Nothing here
loads the compile-time stack: `governor status` stays quick."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from governor.errors import HostError, PolicyNotFound
from governor.operate.status import collect, ledger_lines
from governor.operate.tune import undo
from governor.rundir.journal import Journal
from governor.rundir.state import (
    RunState,
    prune_stale,
    read_states,
    run_dir,
    scan_states,
    states_of,
)


def governed(name: str) -> RunState:
    """The published state of NAME (66 when none; 69 when its supervisor is gone)."""
    st = states_of(run_dir(), name, hint="`governor status` lists what runs")[0]
    if st.plan is None:
        raise PolicyNotFound(
            f"the state of {name} has no plan ({run_dir() / name / 'state.json'})",
            hint="its supervisor rewrites it at its next change; else move the file away",
        )
    if st.stale:
        raise HostError(
            f"the supervisor of {name} is gone (stale state in {run_dir() / name})",
            hint="start it again (governor launch / systemctl start governor@NAME)",
        )
    return st


def rollback(name: str, *, to: int | None, everything: bool) -> dict[str, Any]:
    """`governor rollback`: undo the last tune (or back to an entry, or all) from the journal."""
    st = governed(name)
    journal = Journal(run_dir() / name)
    return undo.rollback(st, name, journal, run_dir(), to=to, everything=everything)


def status(
    name: str | None, *, prune: bool = False, root: Path = Path("/")
) -> list[dict[str, Any]]:
    """`governor status`: governor/operate/status.py over the published states; ``prune``
    first removes the published state of stale entries (their supervisor is gone, or an
    `apply` slice's cgroup), one `pruned NAME` line each on stderr. ``root``: where the
    board's /proc is (MemTotal: `--root`)."""
    if prune:
        pruned = prune_stale(run_dir(), name)
        for policy, pid in pruned:
            why = "its cgroup" if pid is None else f"its supervisor (pid {pid})"
            sys.stderr.write(f"pruned {policy}: {why} is gone\n")
        if name is not None and pruned and not collect_names(run_dir(), name):
            return []  # NAME was only that stale entry
    items = collect(run_dir(), name, root=root)
    # a state file that is not one hides nothing else: one line for it, the others shown
    for err in scan_states(run_dir())[1]:
        if name is None:
            sys.stderr.write(f"governor: skipped a state that is not one: {err}\n")
    if name is None:
        for line in ledger_lines(run_dir(), items):
            sys.stderr.write(f"governor: {line}\n")
    return items


def collect_names(directory: Path, name: str) -> bool:
    """Whether NAME still has a published state."""
    return any(s.policy == name for s in read_states(directory))


def metrics(textfile: Path | None, name: str | None) -> Path | bytes:
    """`governor metrics`: the exposition of the governed slices, written to
    ``textfile/governor.prom`` (atomically) or returned."""
    # deliberate: prometheus_client loads for `governor metrics` only, not for status or tune
    from governor.metrics.export import exposition, write_textfile

    if textfile is not None:
        return write_textfile(textfile, run_dir(), name)
    return exposition(run_dir(), name)
