"""Where a tune's files go: the running policy recompiled with the new values (the same rules
as the policy file), then each changed file sorted by its way to the kernel. Under systemd a
slice-level knob goes through the manager to the unit carrying the limits (runtime
properties); what systemd cannot express, and everything outside systemd, goes to the
policy's group through cgroupfs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from governor.backends import manager
from governor.compile.compiler import Workload, compile_plan
from governor.errors import HostError
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.files import MISSABLE
from governor.operate import tune as t
from governor.plan.host import HostFacts, probe
from governor.plan.model import Plan
from governor.policy.clocks import ClocksSection
from governor.policy.loader import load
from governor.record import record
from governor.rundir.state import RunState


class Route:
    """The files of one tune that go to one group the same way (cgroupfs or the manager)."""

    def __init__(
        self, fs: CgroupFs, group: str, write: t.Writer | None, unit: dict[str, Any] | None
    ) -> None:
        self.fs, self.group, self.write, self.unit = fs, group, write, unit
        self.via = "systemd" if unit else "cgroupfs"
        self.changes: dict[str, str] = {}
        self.live: dict[str, str] = {}


@record
class Routed:
    """A validated tune: its routes (manager first), and what the compile said."""

    routes: list[Route]
    plan_slice: str
    version: int | None  # systemd's, None: not PID 1
    values: dict[str, str]  # kernel file -> the value the compile writes

    def changed(self) -> bool:
        return any(r.changes for r in self.routes)


def _recompiled(
    st: RunState, running: Plan, path: str, overrides: dict[tuple[str, str], object]
) -> tuple[Plan, HostFacts]:
    """The running policy with the overrides, compiled on this host as the launch did."""
    # tune changes cgroup files only; the running plan's clocks stay as they were set
    policy = load(path, overrides=overrides).model_copy(update={"clocks": ClocksSection()})
    host = probe(cgroup_root=running.cgroup_root, target=running.group)
    model = st.model_bytes
    new = compile_plan(
        policy,
        host,
        workload=Workload(model_bytes=model) if model else None,
        allow_missing=MISSABLE,
        source=str(path),
    )
    return new, host


def _manager_route(
    st: RunState, name: str, running: Plan, fs: CgroupFs, version: int | None
) -> Route | None:
    """Under systemd, the route through the manager to the unit carrying the limits."""
    if st.backend != "systemd":
        return None
    if version is None:
        raise HostError(
            f"{name} runs under systemd, but systemd is not PID 1 here (/proc/1)",
            hint="tune it where its service runs",
        )
    unit, cgroup = manager.limits_unit(running.slice)
    return Route(
        fs, cgroup, manager.ManagerWriter(fs, unit, cgroup, version),
        {"unit": unit, "systemd": version},
    )  # fmt: skip


def _new_value(new: Plan, key: str) -> tuple[str, str]:
    """(kernel file, value) the compile writes for policy KEY on the engine's group."""
    file = t.TUNABLE[key][2]
    value = next((w.value for w in new.writes if w.file == file and w.cgroup == new.group), None)
    if value is None:
        raise HostError(
            f"cannot tune {key}: its controller is not enabled here ({file})",
            hint="governor doctor says what this host supports",
        )
    return file, value


def routes(
    st: RunState, name: str, overrides: dict[tuple[str, str], object], run_dir: Path
) -> Routed:
    """Validate the overrides by recompiling the running policy with them, and sort the files
    that change by where they go: under systemd the unit carrying the limits (through the
    manager) or the engine leaf (what systemd cannot express); else the policy's group."""
    running = st.running
    path = st.policy_path or running.source
    if not path:
        raise HostError(
            f"the state of {name} names no policy file ({run_dir / name})",
            hint="launch it again",
        )
    new, host = _recompiled(st, running, path, overrides)
    fs = CgroupFs(Path(running.cgroup_root))
    plain = Route(fs, running.group, None, None)
    version = host.systemd_version
    via_manager = _manager_route(st, name, running, fs, version)
    values: dict[str, str] = {}
    for section, field_ in overrides:
        file, value = _new_value(new, f"{section}.{field_}")
        values[file] = value
        route = plain
        if via_manager is not None and manager.managed(file, value, version or 0):
            route = via_manager
        live = fs.read(route.group, file).strip()
        if live != value:
            route.changes[file] = value
            route.live[file] = live
    chosen = [r for r in (via_manager, plain) if r is not None]
    return Routed(chosen, new.slice, version, values)
