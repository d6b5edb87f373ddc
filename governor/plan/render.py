"""Human-readable renderings of a Plan (the JSON form is ``Plan.model_dump_json``)."""

from __future__ import annotations

from governor.kernel.parse import format_cpulist
from governor.plan.model import Plan, WatchTrigger


def plan_table(plan: Plan) -> str:
    lines = [
        f"policy   {plan.policy}" + (f"  ({plan.source})" if plan.source else ""),
        f"cgroup   {plan.cgroup_root}/{plan.group}   (processes in .../{plan.leaf.rsplit('/', 1)[-1]})",
    ]
    if plan.enable:
        ctrl = " ".join(f"+{c}" for c in plan.controllers)
        where = ", ".join(e.cgroup or "<root>" for e in plan.enable)
        lines.append(f"enable   {ctrl}  in subtree_control of {where}")
    lines.append("")
    if plan.writes:
        width = max(len(w.file) for w in plan.writes)
        vwidth = max(len(w.value) for w in plan.writes)
        lines.append(f"  {'file':<{width}}  {'value':<{vwidth}}  from")
        for w in plan.writes:
            lines.append(f"  {w.file:<{width}}  {w.value:<{vwidth}}  {w.reason}")
    else:
        lines.append("  (no cgroup limits)")
    if plan.protect_parents:
        lines.append(
            f"protect  {plan.slice} {', '.join(plan.protect_parents)} raised to the sum of its"
            " children's (a parent caps its children's protection)"
        )
    launch = plan.launch
    proc = []
    if launch.affinity is not None:
        proc.append(f"affinity={format_cpulist(launch.affinity)}")
    for key in ("user", "group", "oom_score_adj", "nice"):
        val = getattr(launch, key)
        if val is not None:
            proc.append(f"{key}={val}")
    if launch.memlock is not None:
        proc.append(f"memlock={'unlimited' if launch.memlock == -1 else launch.memlock}")
    if launch.env:
        proc.append("env=" + ",".join(sorted(launch.env)))
    proc.append(f"on_governor_exit={launch.on_governor_exit}")
    lines += ["", "process  " + " ".join(proc)]
    if plan.engine.kind != "generic" or plan.engine.max_context_tokens:
        eng = [f"kind={plan.engine.kind}"]
        if plan.engine.max_context_tokens:
            eng.append(f"max_context_tokens={plan.engine.max_context_tokens}")
        if plan.engine.max_cache_ram is not None:
            eng.append(f"max_cache_ram={plan.engine.max_cache_ram}MiB")
        if plan.engine.ready is not None:
            eng.append(f"ready={plan.engine.ready} within {plan.engine.ready_timeout_s:g}s")
        if plan.engine.threads:
            eng.append(f"threads={plan.engine.threads}")
        lines.append("engine   " + " ".join(eng))
    files = (
        plan.prefetch.files
        if isinstance(plan.prefetch.files, str)
        else ",".join(plan.prefetch.files)
    )
    lines.append(f"prefetch mode={plan.prefetch.mode} files={files}")
    if plan.device is not None:  # checked live at launch: backends/device.py
        dev = plan.device
        pool = "MemAvailable" if dev.pool == "system" else "CmaFree"
        lines.append(
            f"device   memory={dev.memory} ({dev.reason}) checked against {pool} at launch"
        )
    for rule in plan.watch:
        t = rule.trigger
        extra = ""
        if rule.hold_s:
            extra += f" for {rule.hold_s:g}s"
        if rule.cooldown_s:
            extra += f" cooldown {rule.cooldown_s:g}s"
        text = t.trigger_text() if isinstance(t, WatchTrigger) else t.text()
        where = f"system {t.file}" if isinstance(t, WatchTrigger) and t.system else t.file
        lines.append(
            f"watch    {where} '{text}'{extra} -> {', '.join(str(a) for a in rule.actions)}"
        )
    for target in plan.clocks:  # board-wide: read back after each write, restored at the end
        for cw in target.writes:
            lines.append(f"clock    {target.path}/{cw.file} = {cw.value}  ({cw.reason})")
    for note in plan.notes:
        lines.append(f"note     {note}")
    for d in plan.degraded:
        lines.append(f"NOT in force: {d}")
    return "\n".join(lines) + "\n"


def enforcement(plan: Plan) -> tuple[list[str], list[str]]:
    """What a launch of this plan enforces, and what it does not, in operator words."""
    on = [f"{w.file}={w.value}" for w in plan.writes]
    launch = plan.launch
    if launch.affinity is not None:
        on.append(f"affinity={format_cpulist(launch.affinity)}")
    if launch.oom_score_adj is not None:
        on.append(f"oom_score_adj={launch.oom_score_adj}")
    if launch.nice is not None:
        on.append(f"nice={launch.nice}")
    if launch.memlock is not None:
        on.append(f"RLIMIT_MEMLOCK={'unlimited' if launch.memlock == -1 else launch.memlock}")
    if launch.user is not None:
        on.append(f"user={launch.user}")
    on.append(f"on_governor_exit={launch.on_governor_exit}")
    off = list(plan.degraded)
    if plan.watch:
        # governor/monitor: PSI triggers, memory/cgroup events and samples -> rules -> actions
        on.append(f"{len(plan.watch)} [[pressure]] rule(s) acted on by the monitor")
    if plan.prefetch.mode == "advise":
        on.append("prefetch=advise (WILLNEED hints from inside the slice)")
    elif plan.prefetch.mode != "none":
        # governor/launch/prefetch.py: runs in the engine's child after it joined the leaf
        on.append(
            f"prefetch={plan.prefetch.mode} (MADV_POPULATE_READ, else MAP_POPULATE, else reads;"
            " mincore top-up; charged to the slice"
            + ("; a locker process holds the mlock)" if plan.prefetch.mode == "lock" else ")")
        )
    return on, off
