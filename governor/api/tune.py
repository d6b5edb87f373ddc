"""`governor tune` in the composition root: the run's published state and journal, then
governor/operate/tune/flow.py (which recompiles the policy: this module is not on the path of
`governor status` or `rollback`)."""

from __future__ import annotations

from typing import Any

from governor.api.operate import governed
from governor.operate.tune import flow
from governor.rundir.journal import Journal
from governor.rundir.state import run_dir

CONFIRM_NOW = flow.CONFIRM_NOW


def tune(
    name: str,
    assignments: tuple[str, ...],
    *,
    dry_run: bool,
    force: bool,
    persist: bool = False,
    confirm: str | None = None,
) -> dict[str, Any]:
    """`governor tune`: validate KEY=VALUE as the policy would, guard, apply in stages, journal.
    Under systemd, slice-level knobs go through the manager (runtime properties). ``confirm``:
    a DURATION after which the change reverts unless confirmed (governor/operate/confirm.py); with no
    assignments, CONFIRM_NOW confirms the pending tunes."""
    st = governed(name)
    journal = Journal(run_dir() / name)
    if not assignments:
        return flow.confirm_pending(name, journal, confirm)
    return flow.tune(
        st,
        name,
        assignments,
        journal,
        run_dir(),
        dry_run=dry_run,
        force=force,
        persist=persist,
        confirm=confirm,
    )
