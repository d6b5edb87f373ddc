"""`governor apply` and `governor remove`: a slice with its limits and no supervisor."""

from __future__ import annotations

import time
from pathlib import Path

from governor.api.host import (
    HostOptions,
    cgroupfs_backend,
    check,
    load_policy,
    probe_host,
    sysfs_root,
)
from governor.backends.cgroupfs import Applied, CgroupfsBackend, Removed
from governor.backends.clocks import ANY_PID, BoardClocks
from governor.compile.compiler import compile_plan
from governor.kernel.files import MISSABLE
from governor.launch.forward import interruptible
from governor.plan.model import Plan
from governor.policy.clocks import ClocksSection
from governor.rundir.state import Publisher, read_states, run_dir
from governor.rundir.state import applied as applied_state


def _hold_clocks(
    plan: Plan, backend: CgroupfsBackend, applied: Applied, directory: Path, opts: HostOptions
) -> None:
    """The board's clocks, held until `governor remove` (no process: pid None)."""
    try:
        clocks = BoardClocks(directory, sysfs_root=sysfs_root(opts))
        clocks.acquire(plan, pid=None, source="apply")
    except BaseException:
        # a refusal changes nothing: undo only what this command wrote and created
        # (the lock removes its own directories once empty); never remove(), which
        # kills what runs in the group: a re-apply's group has the operator's work
        backend.rollback(applied)
        raise


def _publish(plan: Plan, path: Path, directory: Path, created: set[str]) -> None:
    """The state `governor status` shows while the cgroup exists (no supervisor)."""
    # a re-apply creates nothing new: what the first apply created stays its to remove
    prior = Publisher(directory, plan.policy).read()
    where = (plan.cgroup_root, plan.group)
    if prior and prior.source == "apply" and (prior.cgroup_root, prior.group) == where:
        created |= {c for c in prior.created or () if c in plan.create}
    Publisher(directory, plan.policy).publish(
        applied_state(
            plan,
            policy_path=str(path.resolve()),
            created=sorted(created),
            started_at=time.time(),
        )
    )


def apply(path: Path, opts: HostOptions) -> Plan:
    """`governor apply`: create the slice with its limits, no process."""
    plan = check(path, opts)
    directory = run_dir()  # no run directory (69) refuses before anything is applied
    backend = cgroupfs_backend(plan)
    # the lock a launch of the same policy holds for its whole run: apply refuses (69) then;
    # a stop signal while the limits are written rolls them back (exit 128+N), as ^C does
    with backend.lock(plan) as locked, interruptible():
        applied = backend.apply(plan)
        if plan.clocks:
            _hold_clocks(plan, backend, applied, directory, opts)
    _publish(plan, path, directory, set(locked) | set(applied.created))
    return plan


def remove(path: Path, opts: HostOptions) -> Removed:
    """`governor remove`: kill what runs in the policy's group and remove its cgroups."""
    # clocks are released by name below: a board whose clocks no longer resolve still removes
    policy = load_policy(path).model_copy(update={"clocks": ClocksSection()})
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    # removal must work even where the limits could not be enforced any more
    plan = compile_plan(policy, host, allow_missing=MISSABLE, source=str(path))
    # `governor apply` (and `launch --keep`) record what they created: then the slice goes
    # only when it is among them (an operator's slice stays). Without a record (/run lost in a
    # reboot, a kept group from before this record existed) an empty slice the plan would
    # create goes, as before
    mine = [st for st in read_states(run_dir()) if st.policy == plan.policy]
    recorded = [st.created for st in mine if st.created is not None]
    owned: set[str] | None = None
    if recorded:
        owned = {c for created in recorded for c in created}
    removed = cgroupfs_backend(plan).remove(plan, owned=owned)
    # the board's clocks this policy holds (apply's, or a crashed run's): restored when no other
    # policy shares them (governor/backends/clocks.py)
    BoardClocks(run_dir(), sysfs_root=sysfs_root(opts)).release(plan.policy, pid=ANY_PID)
    # the state `governor apply` published; a running launch's is its supervisor's to remove
    if all(st.source == "apply" or st.stale for st in mine):
        Publisher(run_dir(), plan.policy).remove()
    return removed
