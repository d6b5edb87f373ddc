"""Where the engine's unit is under systemd, compiled: the installed service or a transient
scope, its cgroup U and the part of the plan the governor applies inside U.

Both places are compiled ahead (:func:`compile_placements`, at compile time, into the cached
compiled plan); the run time reads its own cgroup and :func:`pick`s one. Nothing is patched
after the compiler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from governor.backends import unitmap
from governor.errors import HostError
from governor.kernel.procfs import ProcFs
from governor.plan.model import EnableControllers, Plan
from governor.record import record, replace

Mode = Literal["service", "scope"]


def delegated_plan(plan: Plan, unit_cgroup: str, systemd_version: int) -> Plan:
    """The part of ``plan`` the governor applies itself inside the unit's cgroup U: create
    U/engine, enable controllers in U, write the deferred files on U/engine.

    The engine leaf is also the plan's group: it holds exactly the engine's processes, like
    ``<slice>/<name>`` in the cgroupfs layout, so the monitor's freeze/kill/reclaim and the
    launch report act on the engine and never on the supervising governor in U/supervisor.
    """
    leaf = f"{unit_cgroup}/{unitmap.ENGINE_LEAF}"
    deferred = unitmap.split(plan, systemd_version).governor
    writes = tuple(replace(d.write, cgroup=leaf) for d in deferred)
    # every controller of the plan, not only the deferred writes': memory.events, memory.peak
    # and cpu.stat of the leaf feed the launch report and the monitor
    needed = plan.controllers
    return replace(
        plan,
        slice=unit_cgroup,
        group=leaf,
        leaf=leaf,
        create=(leaf,),
        enable=(EnableControllers(cgroup=unit_cgroup, controllers=needed),) if needed else (),
        writes=writes,
        controllers=needed,
    )


def parse_proc_cgroup(text: str) -> str:
    """The cgroup2 path (relative to the mount) from /proc/PID/cgroup's ``0::/path`` line."""
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            return path.strip("/")
    raise ValueError("no cgroup2 (0::) line in /proc/self/cgroup")


@record(frozen=True)
class Placement:
    mode: Mode
    unit: str  # the unit name
    cgroup: str  # U, relative to the cgroup root


@record(frozen=True)
class CompiledPlacement:
    """One place the engine's unit can be, compiled: the unit, its cgroup U and the part of the
    plan the governor applies inside U (:func:`delegated_plan`)."""

    mode: Mode
    unit: str
    cgroup: str
    plan: Plan


def compile_placements(plan: Plan, systemd_version: int) -> tuple[CompiledPlacement, ...]:
    """Both places, at compile time: the installed service and the transient scope. Which one
    applies is known only at run time (the process's own cgroup), so both are compiled and the
    run time picks one; nothing is patched after the compiler."""
    service, scope = unitmap.service_cgroup(plan), unitmap.scope_cgroup(plan)
    return (
        CompiledPlacement(
            "service",
            unitmap.service_unit(plan.policy),
            service,
            delegated_plan(plan, service, systemd_version),
        ),
        CompiledPlacement(
            "scope",
            unitmap.scope_unit(plan.policy),
            scope,
            delegated_plan(plan, scope, systemd_version),
        ),
    )


def pick(placements: tuple[CompiledPlacement, ...], own_cgroup: str) -> CompiledPlacement:
    """The service's placement when this process is that service's main process, else the
    scope's; HostError when the service runs outside its policy slice."""
    by_mode = {p.mode: p for p in placements}
    service, scope = by_mode["service"], by_mode["scope"]
    if own_cgroup.rsplit("/", 1)[-1] != service.unit:
        return scope
    if own_cgroup != service.cgroup:
        raise HostError(
            f"{service.unit} runs in /{own_cgroup}, not in its policy slice /{service.cgroup}"
            " (/proc/self/cgroup)",
            hint=f"run `governor install {service.plan.source or service.plan.policy}` and"
            " `systemctl daemon-reload`, then restart the service",
        )
    return service


def own_cgroup(proc_root: Path) -> str:
    proc = ProcFs(proc_root)
    try:
        return parse_proc_cgroup(proc.self_cgroup())
    except (OSError, ValueError) as err:
        raise HostError(
            f"cannot read this process's cgroup ({proc.path('self', 'cgroup')}: {err})"
        ) from err
