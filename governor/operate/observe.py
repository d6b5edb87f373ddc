"""What a governed slice holds and uses, read from the kernel at the time of asking: the one
collector behind `governor status`, `governor top` and the Prometheus metrics
(governor/metrics/). Standard library and the kernel door (CgroupFs) only; writes nothing.

Every reader tolerates a missing file or controller (``None`` / an empty dict): a slice on a
host without the memory controller still has its CPU and pids, and a group that disappears
between two reads is not an error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from governor.backends import manager
from governor.backends.cgroupfs import CgroupfsBackend
from governor.backends.manager import same
from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import holds_process, model_leaves, model_name
from governor.plan.model import Plan
from governor.rundir.journal import Journal
from governor.rundir.liveness import REVERTER, alive

PSI_RESOURCES = ("memory", "cpu", "io")
MEMORY_EVENTS = ("low", "high", "max", "oom", "oom_kill", "oom_group_kill")
# policy spelling -> kernel file of the memory limits a slice can carry (oom.group is no limit)
MEMORY_LIMITS = {
    k: file for k, file in kf.MEMORY_FILES.items() if k not in ("oom_group", "zswap_writeback")
}
UNLIMITED = -1  # limits(): the kernel says "max"


def read_int(fs: CgroupFs, cgroup: str, file: str) -> int | None:
    """The first number in ``file``; None when it is missing or says ``max``."""
    try:
        text = fs.read(cgroup, file).strip()
    except GovernorError:
        return None
    return None if text == "max" else int(text.split()[0])


def _knob_state(
    file: str, policy: str, kernel: str | None, unit: str | None, *, tuned: str | None,
    has_unit: bool,
) -> str:  # fmt: skip

    if kernel is None:
        return "missing"
    if has_unit and unit is not None and not same(file, kernel, unit):
        return "unit drifted"  # the kernel file was written behind the manager's back
    if same(file, kernel, policy):
        return "in sync"
    if tuned is not None and same(file, kernel, tuned):
        return "tuned"
    return "drifted"


def knobs(
    fs: CgroupFs,
    plan: Plan,
    *,
    journal: Journal | None = None,
    systemd: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Each file the policy sets: policy value, kernel value, (under systemd, ``systemd`` from
    the published state) the unit's value, and a state: in sync, tuned (the operator's last
    tune in ``journal``), shed (memory.high at a higher class's throttle), drifted, unit drifted,
    missing; a tune waiting for --confirm says
    when it reverts (``reverts_at``)."""

    reverts = (
        {
            ch["file"]: e["confirm_by"]
            for e in journal.pending()
            if alive(e.get("reverter_pid"), marker=REVERTER)  # gone: nothing will revert it
            for ch in e.get("changes", ())
        }
        if journal is not None
        else {}
    )
    rows: list[tuple[str, str, str, str, bool]] = []  # file, reason, policy, cgroup, unit?
    unit_values: dict[str, str | None] = {}
    if systemd:
        unit_values = manager.unit_values(systemd["unit"])  # looked up here: tests stand in for it
        for lim in systemd.get("limits", []):
            rows.append((lim["file"], lim["reason"], lim["policy"], systemd["cgroup"], True))
    for obs in CgroupfsBackend(fs).observe(plan):
        w = obs.write
        if w.cgroup == plan.group:
            rows.append((w.file, w.reason, w.value, w.cgroup, False))
    # a higher QoS class's shed holds memory.high at its throttle: "shed", not "drifted"
    hold = journal.shed(alive) if journal is not None else None
    out = []
    for file, reason, policy, cgroup, has_unit in rows:
        try:
            kernel: str | None = fs.read(cgroup, file).strip()
        except GovernorError:
            kernel = None
        if kernel is not None and file == kf.IO_WEIGHT:
            kernel = kernel.splitlines()[0]
        unit = unit_values.get(file) if has_unit else None
        tuned = journal.tuned(file) if journal is not None else None
        state = _knob_state(file, policy, kernel, unit, tuned=tuned, has_unit=has_unit)
        if state == "drifted" and hold and file == kf.MEMORY_HIGH and kernel == hold.memory_high:
            state = "shed"
        out.append(
            {
                "file": file,
                "reason": reason,
                "policy": policy,
                "kernel": kernel,
                "unit": unit,
                "state": state,
                "reverts_at": reverts.get(file) if state == "tuned" else None,
            }
        )
    return out


def limits(fs: CgroupFs, group: str) -> dict[str, int]:
    """The memory limits the kernel holds (policy spelling -> bytes; UNLIMITED for ``max``);
    a limit whose file is missing (no memory controller, no swap accounting) is left out."""
    out: dict[str, int] = {}
    for name, file in MEMORY_LIMITS.items():
        try:
            text = fs.read(group, file).strip()
        except GovernorError:
            continue
        out[name] = UNLIMITED if text == "max" else int(text.split()[0])
    return out


def populated(fs: CgroupFs, group: str) -> bool:
    """Some process lives in the group or below it (cgroup.events)."""
    try:
        return fs.populated(group)
    except GovernorError:
        return False


def usage(fs: CgroupFs, group: str) -> dict[str, Any]:
    """Memory (with memory.stat's anon/file and cAdvisor's working set: current minus
    inactive_file), memory.events, PSI (avg10 and the total= microseconds), cpu.stat, pids."""
    stat: dict[str, int] = {}
    with contextlib.suppress(GovernorError):
        stat = fs.memory_stat(group)
    current = read_int(fs, group, kf.MEMORY_CURRENT)
    inactive = stat.get("inactive_file")
    memory = {
        "current": current,
        "peak": read_int(fs, group, kf.MEMORY_PEAK),
        "anon": stat.get("anon"),
        "file": stat.get("file"),
        "swap": read_int(fs, group, kf.MEMORY_SWAP_CURRENT),
        "zswap": read_int(fs, group, kf.MEMORY_ZSWAP_CURRENT),
        "working_set": None if current is None or inactive is None else max(current - inactive, 0),
    }
    try:
        events = {k: v for k, v in fs.memory_events(group).items() if k in MEMORY_EVENTS}
    except GovernorError:
        events = {}
    pressure: dict[str, Any] = {}
    for res in PSI_RESOURCES:
        try:
            p = fs.read_psi(group, res)  # type: ignore[arg-type]  # one of PSI_RESOURCES
        except GovernorError:
            continue
        pressure[res] = {
            "some": {"avg10": p.some.avg10, "total_us": p.some.total},
            "full": None if p.full is None else {"avg10": p.full.avg10, "total_us": p.full.total},
        }
    try:
        cpu = fs.cpu_stat(group)
    except GovernorError:
        cpu = {}
    return {
        "memory": memory,
        "memory_events": events,
        "pressure": pressure,
        "cpu": {
            "usage_usec": cpu.get("usage_usec"),
            "throttled_usec": cpu.get("throttled_usec"),
            "nr_throttled": cpu.get("nr_throttled"),
        },
        "pids": {
            "current": read_int(fs, group, kf.PIDS_CURRENT),
            "max": read_int(fs, group, kf.PIDS_MAX),
        },
    }


def model_rows(
    fs: CgroupFs,
    group: str,
    estimates: Mapping[str, int] | None = None,
    names: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """llama-server's router: one row per model leaf, as the kernel counts it now (a leaf
    stays after its model is unloaded: ``loaded`` says whether a child runs in it). ``names``:
    leaf -> model as the run published it (RunState.model_leaves); a leaf it lacks is named
    by the mapping read back (kernel/leafname.py), else by itself."""
    rows = []
    for cg, leaf in model_leaves(fs, group):
        alias = (names or {}).get(leaf) or model_name(leaf) or leaf
        loaded = holds_process(fs, cg)
        if loaded is None:
            continue  # removed meanwhile
        rows.append(
            {
                "model": alias,
                "leaf": leaf,
                "loaded": loaded,
                "memory_current": read_int(fs, cg, kf.MEMORY_CURRENT),
                "memory_max": read_int(fs, cg, kf.MEMORY_MAX),
                "estimate": (estimates or {}).get(alias),
                "oom_kill": _events(fs, cg).get("oom_kill", 0),
            }
        )
    return rows


def _events(fs: CgroupFs, cg: str) -> dict[str, int]:
    try:
        return fs.memory_events(cg)
    except GovernorError:
        return {}
