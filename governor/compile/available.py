"""What of a plan this host can enforce: the controllers its writes need, along the cgroup path
(the root's, then every cgroup of it that exists), and PSI for the [[pressure]] rules. Missing
ones are a HostError (exit 69) listing all of them with a hint, or with ``--allow-missing``
entries of the plan's `degraded` list."""

from __future__ import annotations

from governor.errors import HostError
from governor.kernel import files as kf
from governor.plan.host import HostFacts
from governor.plan.model import CgroupWrite
from governor.policy import values as v
from governor.policy.model import Policy


def available(
    writes: list[CgroupWrite],
    policy: Policy,
    host: HostFacts,
    allow_missing: frozenset[str],
    problems: list[str],
) -> tuple[list[CgroupWrite], tuple[str, ...], list[str]]:
    """Every controller the writes need, checked along the whole path, and PSI for the
    [[pressure]] rules: (the writes that can be made, the controllers, what is degraded).
    HostError listing every problem unless ``allow_missing`` names what is missing."""
    asked = {w.controller for w in writes}
    if policy.cpu.cpus is not None and policy.cpu.cpus.kind != "all":
        asked.add("cpuset")  # even when the CPU list itself was refused
    needed = tuple(c for c in kf.CONTROLLER_ORDER if c in asked)
    # the plan enables its controllers in the root's and the slice's subtree_control (enable=)
    missing = _missing_controllers(needed, host, enabled=("", policy.slice))
    degraded: list[str] = []
    for ctrl, where in missing.items():
        if ctrl in allow_missing:
            for w in writes:
                if w.controller == ctrl:
                    degraded.append(f"{w.file} = {w.value} ({ctrl} controller missing)")
        else:
            problems.append(f"controller {ctrl} is not available ({where})")
    psi_rules = [r for r in policy.pressure if isinstance(r.when, v.PsiTrigger)]
    if psi_rules and not host.psi and "psi" not in allow_missing:
        problems.append(f"PSI is not available ({host.psi_detail}); [[pressure]] rules need it")
    elif psi_rules and not host.psi:
        degraded.append("[[pressure]] rules (PSI missing)")
    if problems:
        raise HostError(
            "cannot enforce the policy on this host: " + "; ".join(problems),
            hint=_host_hint(host, missing, allow_missing),
            missing=tuple(missing),
        )
    kept = [w for w in writes if w.controller not in missing]
    return kept, tuple(c for c in needed if c not in missing), degraded


def _missing_controllers(
    needed: tuple[str, ...], host: HostFacts, *, enabled: tuple[str, ...]
) -> dict[str, str]:
    """Controller -> where it is missing (file), for every needed controller not usable.

    An existing cgroup on the path that does not have a controller yet is not a problem when
    its parent has it and is one of the ``enabled`` cgroups (whose subtree_control the plan
    writes): the apply enables it there. So a launch that finds its slice just created by
    another launch, before that one enabled the controllers in the root, is not refused.
    """
    mount = host.cgroup_mount or "?"
    missing: dict[str, str] = {}
    for ctrl in needed:
        if ctrl not in host.controllers:
            held = " (held by cgroup v1)" if ctrl in host.v1_controllers else ""
            missing[ctrl] = f"{mount}/{kf.CGROUP_CONTROLLERS}{held}"
            continue
        usable = {""}  # the root offers it: checked above
        for level in host.path:
            parent = level.path.rpartition("/")[0]
            if ctrl in level.controllers or (parent in enabled and parent in usable):
                usable.add(level.path)
                continue
            missing[ctrl] = f"{mount}/{level.path}/{kf.CGROUP_CONTROLLERS}"
            break
    return missing


def _host_hint(host: HostFacts, missing: dict[str, str], allow: frozenset[str]) -> str:
    todo = sorted(set(missing) - allow)
    parts = []
    if host.cgroup_layout == "hybrid" and any(c in host.v1_controllers for c in todo):
        parts.append(
            "boot with systemd.unified_cgroup_hierarchy=1 to move controllers to cgroup v2"
        )
    if todo:
        parts.append(f"{'or ' if parts else ''}run degraded with --allow-missing {','.join(todo)}")
    if not host.psi:
        parts.append("add psi=1 to the kernel command line for [[pressure]] rules")
    parts.append("`governor doctor` explains what this host supports")
    return "; ".join(parts)
