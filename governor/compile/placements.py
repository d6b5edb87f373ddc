"""Both places the engine's unit can be under systemd, compiled ahead: the installed service and
the transient scope (records in governor/plan/placement.py). Which one applies is known only at
run time (:func:`governor.backends.placement.pick`), so both go into the cached compiled plan.
"""

from __future__ import annotations

from governor.plan import unitmap
from governor.plan.model import EnableControllers, Plan
from governor.plan.placement import CompiledPlacement
from governor.record import replace


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
