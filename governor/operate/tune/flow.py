"""A tune from start to end: validate and route (route.py), guard, persist when asked
(persisted.py), apply every route with an undo for all of them, hand the entries to the
--confirm reverter (governor/operate/confirm.py). The composition root
(api/tune.py) finds the run and its journal and calls this; a rollback is undo.py."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from governor.deploy import tunedropin
from governor.errors import PolicyError, UsageError, one_line
from governor.operate import confirm as c
from governor.operate import tune as t
from governor.operate.tune import persisted as p
from governor.operate.tune.route import Route, Routed, routes
from governor.policy.durations import parse_seconds
from governor.rundir.journal import Journal
from governor.rundir.state import RunState

CONFIRM_NOW = "now"  # the value of a bare --confirm (typer flag_value)


def confirm_pending(name: str, journal: Journal, confirm: str | None) -> dict[str, Any]:
    """`governor tune NAME --confirm` (no assignments): keep the pending tunes."""
    if confirm != CONFIRM_NOW:
        raise UsageError(
            "nothing to tune (KEY=VALUE, --confirm)",
            hint="governor tune NAME KEY=VALUE..., or `governor tune NAME --confirm` to keep"
            " a change made with --confirm DURATION",
        )
    kept = c.confirm(journal)
    return {"policy": name, "confirmed": [e["id"] for e in kept], "changes": []}


def confirm_seconds(confirm: str | None) -> float | None:
    """--confirm DURATION as seconds (None: no --confirm); PolicyError (65) for a bad one."""
    if confirm is None:
        return None
    try:
        return parse_seconds("" if confirm == CONFIRM_NOW else confirm)
    except ValueError:
        raise PolicyError(
            f"bad --confirm duration {confirm if confirm != CONFIRM_NOW else ''!r}",
            field="--confirm",
            hint="e.g. --confirm 5m (s, m, h); `governor tune NAME --confirm` alone keeps"
            " the pending change",
        ) from None


def guard(routes: list[Route], journal: Journal, *, force: bool, dry_run: bool) -> None:
    """The guards against the live groups (tune.check_guards); a refusal is journaled, a fact
    about the slice (governor_tunes_total{refused}), unless it was a dry run."""
    try:
        for r in routes:
            t.check_guards(r.fs, r.group, r.changes, force=force)
    except PolicyError as err:
        if not dry_run:
            journal_failure(journal, "tune-refused", routes, err)
        raise


def journal_failure(journal: Journal, source: str, routes: list[Route], err: Exception) -> None:
    """A tune that changed nothing in the end: refused by a guard, or reverted after an OOM
    kill. Journaled without changes (rollback and the monitor skip it; status and the
    governor_tunes_total{result} counter show it)."""
    asked = [{"file": f, "new": v} for r in routes for f, v in r.changes.items()]
    with contextlib.suppress(OSError):
        journal.append(source, [], asked=asked, error=one_line(str(err)))


def apply_routes(
    routes: list[Route],
    journal: Journal,
    extra: dict[str, Any],
    reverter: c.Reverter | None,
    changes: list[dict[str, Any]],
) -> list[int]:
    """Apply each route (one journal entry each; ``changes`` collects what they changed) and
    return the entry ids. All or nothing: a failure undoes the routes already applied (or the
    persisted drop-in), cancels the reverter and journals an OOM revert."""
    ids: list[int] = []
    try:
        for r in routes:
            if not r.changes:
                continue
            entry = t.apply(
                r.fs, r.group, r.changes, journal=journal, write=r.write, unit=r.unit, extra=extra
            )
            ids.append(entry["id"])
            changes += entry["changes"]
        if not ids and extra.get("dropin"):
            ids.append(journal.append("tune", [], **extra)["id"])
    except BaseException as err:
        if reverter is not None:
            reverter.cancel()
        if isinstance(err, t.OomReverted):
            journal_failure(journal, "tune-reverted", routes, err)
        if ids:  # an earlier route was applied: undo it, nothing half-applied
            t.rollback(routes[0].fs, journal, ids=ids, reason="a later write failed")
        elif extra.get("dropin"):
            tunedropin.restore_dropin(extra["dropin"])
        raise
    return ids


def _dry_run(name: str, routed: Routed) -> dict[str, Any]:
    changes = [
        {"file": f, "kernel": r.live[f], "new": v, "via": r.via}
        for r in routed.routes
        for f, v in r.changes.items()
    ]
    return {"policy": name, "dry_run": True, "changes": changes}


def _reverter(
    run_dir: Path, name: str, st: RunState, seconds: float, extra: dict[str, Any]
) -> c.Reverter:
    """The --confirm reverter, its deadline and pid (and scope) noted in ``extra``."""
    deadline = round(time.time() + seconds, 3)
    reverter = c.Reverter(run_dir, name, st.running.cgroup_root, deadline)
    extra.update(confirm_by=deadline, reverter_pid=reverter.pid)
    if reverter.unit is not None:
        extra["reverter_unit"] = reverter.unit  # its own scope: survives a logout
    return reverter


def tune(
    st: RunState,
    name: str,
    assignments: tuple[str, ...],
    journal: Journal,
    run_dir: Path,
    *,
    dry_run: bool,
    force: bool,
    persist: bool,
    confirm: str | None,
) -> dict[str, Any]:
    """Validate KEY=VALUE as the policy would, guard, persist (--persist), apply in stages
    with an undo for every route, journal; --confirm DURATION hands the entries to a reverter."""
    seconds = confirm_seconds(confirm)
    overrides = t.parse_assignments(assignments)
    routed = routes(st, name, overrides, run_dir)
    guard(routed.routes, journal, force=force, dry_run=dry_run)
    if dry_run:
        return _dry_run(name, routed)
    out: dict[str, Any] = {"policy": name, "dry_run": False, "changes": []}
    extra: dict[str, Any] = {}
    saved = p.persist(st, name, overrides, routed) if persist else None
    before: str | None = None
    if saved is not None:
        before = saved.pop("before", None)  # what goes back when the change then fails
        out["persisted"] = saved
        if saved.get("dropin"):
            extra["dropin"] = saved["dropin"]
    reverter = None
    if seconds is not None and routed.changed():
        reverter = _reverter(run_dir, name, st, seconds, extra)
    try:
        ids = apply_routes(routed.routes, journal, extra, reverter, out["changes"])
    except BaseException:
        if saved is not None and before is not None:  # nothing half-applied: the file too
            p.undo_file(saved, before)
        raise
    if reverter is not None:
        reverter.go(ids)
        out["confirm_by"] = extra["confirm_by"]
    if ids:
        out["id"] = ids[-1]
    return out
