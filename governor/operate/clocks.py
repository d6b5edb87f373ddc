"""[clocks] on the live board, for `governor status` and `governor diff`: each clock file the
plan writes, its value now, and who holds the device in the ledger (governor/rundir/clocks.py).
Reads only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from governor.backends.clocks import same
from governor.errors import GovernorError
from governor.kernel import clocks as kc
from governor.plan.model import Plan
from governor.rundir.clocks import Ledger


def _live(path: str) -> str | None:
    try:
        return kc.read(path)
    except GovernorError:
        return None


def observe(plan: Plan, run: Path) -> list[dict[str, Any]]:
    """One row per planned clock write: ``state`` is in sync / drifted / missing (the file is
    gone), or ``not held`` when the ledger has no hold of this policy on the device."""
    entries = Ledger(run).read()
    rows: list[dict[str, Any]] = []
    for target in plan.clocks:
        entry = entries.get(target.path)
        holders = [h.policy for h in entry.holders] if entry is not None else []
        for w in target.writes:
            path = os.path.join(target.path, w.file)
            live = _live(path)
            if live is None:
                state = "missing"
            elif plan.policy not in holders:
                state = "not held"
            else:
                state = "in sync" if same(live, w.value) else "drifted"
            rows.append(
                {
                    "key": target.key,
                    "device": target.name,
                    "file": path,
                    "policy": w.value,
                    "kernel": live,
                    "state": state,
                    "holders": holders,
                    "restore_failed": (entry.failed if entry is not None else None) or [],
                }
            )
    return rows


def drift(plan: Plan) -> list[dict[str, Any]]:
    """For diff: every planned clock write whose live value differs (or cannot be read)."""
    out = []
    for target in plan.clocks:
        for w in target.writes:
            path = os.path.join(target.path, w.file)
            live = _live(path)
            if live is None or not same(live, w.value):
                out.append({"file": path, "plan": w.value, "kernel": live})
    return out


def render(rows: list[dict[str, Any]]) -> list[str]:
    """status lines: ``clock    big policy4 scaling_governor  userspace  userspace  in sync``."""
    lines = []
    for r in rows:
        held = f"  held by {', '.join(r['holders'])}" if r["holders"] else ""
        lines.append(
            f"  clock    {r['key']:<6} {r['device']:<13} {os.path.basename(r['file']):<17}"
            f" {r['policy']:>11} {r['kernel'] or '-':>11}  {r['state']}{held}"
        )
        for problem in r["restore_failed"]:
            lines.append(f"  NOT restored: {problem}")
    return lines
