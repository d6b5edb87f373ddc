"""`governor rollback NAME`: undo the last tune (or back to an entry, or all) from the journal,
each change through the way it was made (cgroupfs or the manager), a persisted drop-in put back
first. Light on purpose: no compile, so an operator's undo starts at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from governor.deploy import tunedropin
from governor.errors import PolicyError, PolicyNotFound
from governor.kernel.cgroupfs import CgroupFs
from governor.operate import tune as t
from governor.rundir.journal import Journal
from governor.rundir.state import RunState


def _nothing_left(to: int | None, everything: bool) -> str:
    if to is not None:
        return f"no change after journal entry {to}"
    return "no change left to undo" if everything else "no tune left to undo"


def rollback(
    st: RunState, name: str, journal: Journal, run_dir: Path, *, to: int | None, everything: bool
) -> dict[str, Any]:
    """Undo the last tune (or back to an entry, or all) from the journal."""
    running = st.running
    try:
        with journal.locked():  # not while the --confirm reverter decides
            return t.rollback(
                CgroupFs(Path(running.cgroup_root)),
                journal,
                to=to,
                everything=everything,
                restore_file=tunedropin.restore_dropin,
            )
    except t.NothingToRollBack as err:
        # no journal entry to act on: the input is missing (66), the policy is not invalid
        raise PolicyNotFound(
            f"nothing to roll back for {name}: {_nothing_left(to, everything)} ({journal.path})",
            hint=f"`governor status {name}` shows the journal; without --all only `governor"
            " tune` changes are undone (--all also undoes the monitor's actions)",
        ) from err
    except ValueError as err:
        raise PolicyError(f"{err} for {name} ({run_dir / name / 'journal.jsonl'})") from err
