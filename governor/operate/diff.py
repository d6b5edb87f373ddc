"""`governor diff POLICY`: the policy compiled on this host vs the kernel vs the installed
systemd files (what `install` would render now), plus the prerequisites the policy needs.

Pure comparison over values the caller reads (api/diff.py does the I/O): every mismatch is listed
with both values; ``in_sync`` is False when there is one (exit 1), True otherwise (exit 0).
A limit left out on purpose (`--allow-missing`, given to diff or to the launch that runs the
policy) is listed as skipped and is no drift: one answer with governor_policy_drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from governor.backends.cgroupfs import Observation
from governor.kernel import files as kf
from governor.plan.host import HostFacts
from governor.plan.model import Plan
from governor.rundir.state import read_states


def skipped_name(limit: str) -> str:
    """The --allow-missing name that leaves a ``plan.degraded`` entry out of force: its
    controller (``memory.max = 1 (memory controller missing)`` -> ``memory``), ``psi`` or ``zswap``
    (a zswap file the kernel is too old for)."""
    if limit.startswith("[[pressure]]"):
        return "psi"
    if limit.startswith("memory.zswap."):
        return "zswap"
    return kf.controller_of(limit.split(" = ", 1)[0]) or ""


def prerequisites(
    plan: Plan, host: HostFacts, skipped: Mapping[str, str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(what is missing, what is skipped): cgroup2, the limits a missing controller leaves out
    (the plan was compiled with every controller allowed missing, so each such limit is in
    ``plan.degraded``), PSI. ``skipped`` maps an --allow-missing name to who skips it (this
    command's --allow-missing, or the launch that runs the policy): a limit or PSI it names
    is listed as skipped, not missing, as the launch (and governor_policy_drift) sees it."""
    skipped = skipped or {}
    out: list[dict[str, Any]] = []
    skips: list[dict[str, Any]] = []
    if host.cgroup_mount is None:
        out.append({"what": "cgroup2", "want": "mounted", "have": "not mounted"})
    for limit in plan.degraded:  # compiled with every controller allowed missing
        name = skipped_name(limit)
        if name in skipped:
            skips.append({"what": "limit", "want": limit, "by": skipped[name]})
        else:
            out.append({"what": "limit", "want": limit, "have": "not in force"})
    if plan.watch and not host.psi:
        if "psi" in skipped:
            skips.append({"what": "psi", "want": "enabled", "by": skipped["psi"]})
        else:
            out.append({"what": "psi", "want": "enabled", "have": host.psi_detail})
    return out, skips


def kernel(plan: Plan, observed: list[Observation] | None) -> list[dict[str, Any]]:
    """Each planned write whose live value differs (None: the group does not exist)."""
    if observed is None:
        return [{"cgroup": plan.group, "file": None, "plan": "applied", "kernel": "does not exist"}]
    return [
        {"cgroup": o.write.cgroup, "file": o.write.file, "plan": o.write.value, "kernel": o.live}
        for o in observed
        if not o.matches
    ]


def unit_files(rendered: dict[str, str], on_disk: dict[str, str | None]) -> list[dict[str, Any]]:
    """Files install would write now vs the files there (ExecStart= lines are not compared:
    the engine's command line is not part of the policy)."""

    def strip(text: str | None) -> str | None:
        if text is None:
            return None
        return "\n".join(ln for ln in text.splitlines() if not ln.startswith("ExecStart="))

    return [
        {"file": path, "rendered": text, "installed": on_disk.get(path)}
        for path, text in rendered.items()
        if strip(text) != strip(on_disk.get(path))
    ]


def report(
    plan: Plan,
    host: HostFacts,
    observed: list[Observation] | None,
    rendered: dict[str, str] | None,
    on_disk: dict[str, str | None] | None,
    *,
    clocks: list[dict[str, Any]] | None = None,
    skipped: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    pre, skips = prerequisites(plan, host, skipped)
    kern = kernel(plan, observed)
    units = unit_files(rendered, on_disk or {}) if rendered is not None else []
    clocks = clocks or []
    return {
        "policy": plan.policy,
        "group": f"{plan.cgroup_root}/{plan.group}",
        "in_sync": not (pre or kern or units or clocks),
        "prerequisites": pre,
        "skipped": skips,  # left out on purpose (--allow-missing): not drift
        "kernel": kern,
        "systemd": units,
        "systemd_checked": rendered is not None,
        "clocks": clocks,  # [clocks] files whose live value differs (operate/clocks.py)
    }


def render(out: dict[str, Any]) -> str:
    lines = [f"{out['policy']}: {'in sync' if out['in_sync'] else 'DRIFT'} ({out['group']})"]
    for p in out["prerequisites"]:
        lines.append(f"  prerequisite {p['what']}: want {p['want']}, have {p['have']}")
    for p in out.get("skipped", []):
        lines.append(f"  skipped {p['what']}: {p['want']} (by {p['by']})")
    for k in out["kernel"]:
        if k["file"] is None:
            lines.append(f"  kernel {k['cgroup']}: {k['kernel']} (not applied or not running)")
        else:
            lines.append(
                f"  kernel {k['cgroup']}/{k['file']}: plan {k['plan']}, kernel {k['kernel']}"
            )
    for c in out.get("clocks", []):
        lines.append(f"  clock {c['file']}: plan {c['plan']}, kernel {c['kernel'] or 'unreadable'}")
    for u in out["systemd"]:
        state = "missing" if u["installed"] is None else "differs from what install renders now"
        if u["rendered"] == "":
            state = "a persisted tune overrides the policy (governor rollback NAME --all undoes it)"
        lines.append(f"  systemd {u['file']}: {state}")
    if not out["systemd_checked"]:
        lines.append("  systemd: not installed for this policy (no manifest), not compared")
    return "\n".join(lines) + "\n"


def launch_skipped(plan: Plan, run: Path) -> set[str]:
    """What the launch (or apply) that runs this policy was told to skip: the --allow-missing
    names behind its published plan's ``degraded`` limits (none when nothing runs it)."""
    out: set[str] = set()
    for st in read_states(run):
        running = st.plan
        if st.policy != plan.policy or st.stale or running is None:
            continue
        out |= {skipped_name(x) for x in running.degraded}
    return out
