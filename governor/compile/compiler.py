"""compile(policy, host) -> Plan. Pure: no files, no environment, no clock.

Every command (check, plan, apply, launch, install) goes through this one function, so what
``governor plan`` prints is exactly what ``launch`` writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from governor.compile.available import available
from governor.compile.clocks import resolve as resolve_clocks
from governor.compile.triggers import Site
from governor.errors import HostError, PolicyError
from governor.kernel import files as kf
from governor.kernel.parse import format_cpulist
from governor.monitor import triggers
from governor.plan.host import HostFacts
from governor.plan.model import (
    SHED_STEPS,
    Action,
    CgroupWrite,
    DeviceSpec,
    EnableControllers,
    EngineSpec,
    LaunchSpec,
    Plan,
    PrefetchSpec,
    QosSpec,
    RouterModelSpec,
    WatchCondition,
    WatchRule,
    WatchTrigger,
)
from governor.policy import values as v
from governor.policy.model import Policy

LEAF = "engine"  # processes live only in leaves (no internal processes rule)

# memlock = "model": the model's size plus room for the engine's own small locked buffers
MEMLOCK_MODEL_MARGIN = 64 << 20
# memory.min = "model": the model's file pages plus a margin for the engine's hot anon pages
MEMORY_MIN_MODEL_MARGIN = 64 << 20

# Memory files in the order they are written: oom.group first so that a limit that takes
# effect at once already kills the group together; protection before limits.
_MEMORY_ORDER = (
    "oom_group", "swap_max", "zswap_max", "zswap_writeback", "min", "low", "high", "max",
)  # fmt: skip
_MEMORY_FILE = kf.MEMORY_FILES


@dataclass(frozen=True)
class Workload:
    """What is known about the engine to launch (from its argv and a stat of its model)."""

    model_bytes: int | None = None


Write = tuple[str, str, str]  # (kernel file, value, the policy field that asked for it)


def _pids(policy: Policy) -> list[Write]:
    return [] if policy.pids.max is None else [(kf.PIDS_MAX, str(policy.pids.max), "pids.max")]


def _memory(
    policy: Policy, host: HostFacts, workload: Workload, notes: list[str], source: str | None
) -> list[Write]:
    """memory.* in _MEMORY_ORDER, sizes resolved on this host (percentages, "model"), page
    aligned; PolicyError when min <= low <= high <= max does not hold once resolved."""
    mem = policy.memory
    out: list[Write] = []
    resolved: dict[str, int | None] = {}
    for key in _MEMORY_ORDER:
        if key in ("oom_group", "zswap_writeback"):  # switches: "1" / "0"
            if (on := getattr(mem, key)) is not None:
                out.append((_MEMORY_FILE[key], "1" if on else "0", f"memory.{key}"))
            continue
        size: v.Size | None = getattr(mem, key)
        if size is None:
            continue
        nbytes = _resolve_memory(
            size, key, host=host, workload=workload, notes=notes, source=source
        )
        resolved[key] = nbytes
        value = "max" if nbytes is None else str(_page_floor(nbytes, host.page_size))
        out.append((_MEMORY_FILE[key], value, f"memory.{key}"))
    _check_memory_order(resolved, source)
    return out


def _io(policy: Policy) -> list[Write]:
    w = policy.io.weight
    return [] if w is None else [(kf.IO_WEIGHT, f"default {w}", "io.weight")]


def _cpu(policy: Policy) -> list[Write]:
    out: list[Write] = []
    if policy.cpu.weight is not None:
        out.append((kf.CPU_WEIGHT, str(policy.cpu.weight), "cpu.weight"))
    if policy.cpu.max is not None:
        out.append((kf.CPU_MAX, policy.cpu.max.kernel_value(), "cpu.max"))
    return out


def _cpuset(
    policy: Policy, host: HostFacts, problems: list[str], notes: list[str]
) -> tuple[list[Write], tuple[int, ...] | None]:
    """cpuset.cpus and the engine's affinity (None: no cpu.cpus in the policy)."""
    if policy.cpu.cpus is None:
        return [], None
    affinity = _resolve_cpus(policy.cpu.cpus, host, problems, notes)
    if affinity and policy.cpu.cpus.kind != "all":
        return [(kf.CPUSET_CPUS, format_cpulist(affinity), "cpu.cpus")], affinity
    return [], affinity


def compile_plan(
    policy: Policy,
    host: HostFacts,
    *,
    workload: Workload | None = None,
    allow_missing: frozenset[str] = frozenset(),
    source: str | None = None,
    attach: str | None = None,
) -> Plan:
    """Resolve a policy against one host. Raises HostError (69) listing every problem, or
    PolicyError (65) when the policy contradicts itself once resolved on this host.

    ``attach``: the plan of an existing cgroup (relative to the root; `governor monitor
    --cgroup`, e.g. a systemd unit's): group and leaf are that cgroup, and so are the writes."""
    workload = workload or Workload()
    if host.cgroup_mount is None:
        raise HostError(
            "no cgroup2 hierarchy is mounted (/proc/self/mountinfo)",
            hint="mount -t cgroup2 none /sys/fs/cgroup, or boot with systemd.unified_cgroup_hierarchy=1",
        )
    notes: list[str] = []
    problems: list[str] = []
    group = attach if attach is not None else f"{policy.slice}/{policy.name}"
    # one helper per controller, called in the order the files are written (runc's: pids
    # first); memory's PolicyError comes before the CPU list is resolved
    files = [*_pids(policy), *_memory(policy, host, workload, notes, source), *_io(policy)]
    files += _cpu(policy)
    cpuset, affinity = _cpuset(policy, host, problems, notes)
    clocks = resolve_clocks(policy.clocks, host, source, notes)
    writes = [
        CgroupWrite(
            cgroup=group, file=file, value=value, reason=reason, controller=kf.controller_of(file)
        )
        for file, value, reason in (*files, *cpuset)
    ]
    asked = tuple(writes)  # a headroom rule's peak claim, whatever this host enforces
    writes, controllers, degraded = available(writes, policy, host, allow_missing, problems)

    create = (policy.slice, group, f"{group}/{LEAF}") if attach is None else ()
    enable = (
        (
            EnableControllers(cgroup="", controllers=controllers),
            EnableControllers(cgroup=policy.slice, controllers=controllers),
        )
        if controllers
        else ()
    )
    return Plan(
        policy=policy.name,
        source=source,
        cgroup_root=host.cgroup_mount,
        slice=policy.slice,
        group=group,
        leaf=f"{group}/{LEAF}" if attach is None else group,
        create=create,
        enable=enable,
        writes=tuple(writes),
        controllers=controllers,
        launch=_launch_spec(policy, affinity, workload),
        engine=_engine_spec(policy, host),
        prefetch=PrefetchSpec(files=policy.prefetch.files, mode=policy.prefetch.mode),
        protect_parents=tuple(
            w.file for w in writes if w.file in (kf.MEMORY_MIN, kf.MEMORY_LOW) and w.value != "0"
        ),
        watch=_watch(policy, asked, source, workload.model_bytes),
        notes=tuple(notes),
        degraded=tuple(degraded),
        device=_device(policy, workload),
        clocks=clocks,
        qos=_qos(policy, source),
    )


def _engine_spec(policy: Policy, host: HostFacts) -> EngineSpec:
    e = policy.engine

    def size(s: v.Size | None) -> int | None:
        return None if s is None else s.resolve(host.mem_total)

    return EngineSpec(
        kind=e.kind,
        max_context_tokens=e.max_context_tokens,
        max_cache_ram=e.max_cache_ram,
        ready=e.ready,
        ready_timeout_s=e.ready_timeout.seconds,
        probe_generate_s=None if e.probe_generate is None else e.probe_generate.seconds,
        threads=e.threads,
        evict=e.evict,
        models=tuple(
            RouterModelSpec(alias=a, max=size(m.max), high=size(m.high), oom_group=m.oom_group)
            for a, m in sorted(e.models.items())
        ),
    )


def _watch(
    policy: Policy, writes: Sequence[CgroupWrite], source: str | None, model_bytes: int | None
) -> tuple[WatchRule, ...]:
    """The [[pressure]] rules as the run time's monitor watches them, in the policy's order."""
    return tuple(
        watch_rule(
            i,
            _watch_trigger(r.when, Site(i, writes, source, model_bytes)),
            tuple(r.do),
            when=str(r.when),
            hold_s=r.for_.seconds if r.for_ else None,
            cooldown_s=r.cooldown.seconds if r.cooldown else None,
        )
        for i, r in enumerate(policy.pressure)
    )


def _qos(policy: Policy, source: str | None) -> QosSpec:
    """The class, and the steps the policy yields in the ladder's order (whatever its own).
    A combination that could never do anything is refused, not accepted silently: `shed` on
    a background policy (no class ranks below it), `yield` on an interactive one (none above:
    no shed ever takes a step on it)."""
    cls = policy.qos.class_
    for i, rule in enumerate(policy.pressure):
        if cls == "background" and any(a.verb == "shed" for a in rule.do):
            raise PolicyError(
                "`shed` on a background policy: no class ranks below background, it could"
                " never take anything",
                file=source,
                field=f"pressure[{i}].do",
                hint='remove the shed action, or give the policy [qos] class = "standard"',
            )
    if cls == "interactive" and "yield_" in policy.qos.model_fields_set:
        raise PolicyError(
            "`yield` on an interactive policy: no class ranks above interactive, no shed ever"
            " takes a step on it",
            file=source,
            field="qos.yield",
            hint="remove qos.yield, or give the policy a lower [qos] class",
        )
    yields = tuple(s for s in SHED_STEPS if s in policy.qos.yield_)
    return QosSpec(
        qos_class=policy.qos.class_,
        yields=yields,
        admit=policy.qos.admit,
        admit_timeout_s=policy.qos.admit_timeout.seconds,
    )


def _device(policy: Policy, workload: Workload) -> DeviceSpec | None:
    """[device] memory: a size, or "model" (the model file's size; what an rkllm engine gets
    when it says nothing: RKLLM loads the .rkllm file into NPU memory)."""
    size = policy.device.memory
    reason = "device.memory"
    if size is None and policy.engine.kind == "rkllm":
        size, reason = v.Size("model"), "engine.kind = rkllm (the .rkllm file)"
    if size is None:
        return None
    memory: int | Literal["model"] = size.bytes if size.kind == "bytes" else "model"
    if memory == "model" and workload.model_bytes is not None:
        memory = workload.model_bytes
    return DeviceSpec(memory=memory, pool=policy.device.pool, reason=reason)


def _row(t: WatchTrigger | WatchCondition) -> triggers.Trigger:
    return triggers.fallback() if isinstance(t, WatchTrigger) else triggers.row(t.condition)


def when_text(t: WatchTrigger | WatchCondition) -> str:
    """A compiled rule condition as the monitor reports it (``memory some 150ms/2s``)."""
    text: str = triggers.load(_row(t).compile).text(t)
    return text


def watch_rule(
    index: int,
    trigger: WatchTrigger | WatchCondition,
    actions: tuple[v.Action | str, ...],
    *,
    hold_s: float | None = None,
    cooldown_s: float | None = None,
    when: str | None = None,
) -> WatchRule:
    """One [[pressure]] rule, compiled (actions may be given in the policy's spelling);
    ``when``: the policy's spelling of the condition (default: :func:`when_text`)."""
    return WatchRule(
        index=index,
        trigger=trigger,
        when=when if when is not None else when_text(trigger),
        actions=tuple(compile_action(v.parse_action(a)) for a in actions),
        hold_s=hold_s,
        cooldown_s=cooldown_s,
    )


def compile_action(a: v.Action) -> Action:
    """A policy action as the executor takes it: sizes in bytes, cpu.max as the kernel's
    "quota period", durations in seconds; ``text`` keeps the policy's canonical spelling."""
    value = a.value
    nbytes = None
    if a.size is not None and a.size.kind == "bytes":
        nbytes = a.size.bytes
    if a.verb == "set" and a.file == kf.CPU_MAX and a.value is not None:
        value = v.parse_cpu_max(a.value).kernel_value()
    elif a.verb == "set" and a.size is not None:
        value = "max" if a.size.kind == "max" else str(a.size.bytes)
    return Action(
        verb=a.verb,
        text=str(a),
        signal=a.signal,
        bytes=nbytes,
        file=a.file,
        value=value,
        relative_percent=None if a.relative_percent is None else f"{a.relative_percent:f}",
        duration_s=None if a.duration is None else a.duration.seconds,
        argv=a.argv,
        swappiness=a.swappiness,
    )


def _watch_trigger(when: v.Condition, site: Site | None = None) -> WatchTrigger | WatchCondition:
    """A rule's ``when`` as the monitor needs it (monitor/sources.py arms or reads it): its
    kind's compile (monitor/triggers.py), the row found by the condition's own spelling."""
    compiled: WatchTrigger | WatchCondition = triggers.load(
        triggers.grammar_for(str(when)).compile
    ).watch(when, site)
    return compiled


def _page_floor(nbytes: int, page_size: int) -> int:
    # memory.{min,low,high,max,swap.max}: page_counter_memparse() stores bytes / PAGE_SIZE,
    # so the file reads back rounded down to a page multiple (mm/page_counter.c)
    return nbytes // page_size * page_size


def _resolve_memory(
    size: v.Size,
    key: str,
    *,
    host: HostFacts,
    workload: Workload,
    notes: list[str],
    source: str | None,
) -> int | None:
    if size.kind == "model":
        if workload.model_bytes is None:
            raise PolicyError(
                f'memory.{key} = "model" needs the model file; give the engine command line',
                file=source,
                field=f"memory.{key}",
                hint="governor launch --policy P -- ENGINE -m MODEL ..., or a size like 1.2GiB",
            )
        protect = workload.model_bytes + MEMORY_MIN_MODEL_MARGIN
        notes.append(
            f"memory.{key} = model -> {v.human_bytes(protect)} (model"
            f" {v.human_bytes(workload.model_bytes)} + {v.human_bytes(MEMORY_MIN_MODEL_MARGIN)})"
        )
        return protect
    nbytes = size.resolve(host.mem_total)
    if size.kind == "percent" and nbytes is not None:
        notes.append(
            f"memory.{key} = {size} of MemTotal {v.human_bytes(host.mem_total)}"
            f" -> {v.human_bytes(nbytes)}"
        )
    return nbytes


def _check_memory_order(resolved: dict[str, int | None], source: str | None) -> None:
    order = [k for k in ("min", "low", "high", "max") if k in resolved]
    for i, lo in enumerate(order):
        for hi in order[i + 1 :]:
            a, b = resolved[lo], resolved[hi]
            if b is not None and (a is None or a > b):
                raise PolicyError(
                    f"memory.{lo} ({_fmt(a)}) is above memory.{hi} ({_fmt(b)}) on this host",
                    file=source,
                    field="memory",
                    hint="min <= low <= high <= max must hold once percentages are resolved",
                )


def _fmt(n: int | None) -> str:
    return "max" if n is None else v.human_bytes(n)


def _resolve_cpus(
    spec: v.CpuSpec, host: HostFacts, problems: list[str], notes: list[str]
) -> tuple[int, ...]:
    online = set(host.cpus_online)
    if spec.kind == "all":
        return host.cpus_online
    if spec.kind in ("big", "little"):
        if host.core_types is None:
            problems.append(
                f'cpu.cpus = "{spec.kind}" but this host has no distinct core types'
                " (all CPUs report the same capacity/frequency)"
            )
            return ()
        cpus = host.core_types.big if spec.kind == "big" else host.core_types.little
        notes.append(
            f"cpu.cpus = {spec.kind} -> {format_cpulist(cpus)} (from {host.core_types.source})"
        )
        return cpus
    offline = [c for c in spec.cpus if c not in online]
    if offline:
        problems.append(
            f"cpu.cpus names CPU {format_cpulist(offline)} which is not online"
            f" (online: {format_cpulist(host.cpus_online)})"
        )
        return ()
    return spec.cpus


def _launch_spec(
    policy: Policy, affinity: tuple[int, ...] | None, workload: Workload
) -> LaunchSpec:
    proc = policy.process
    memlock: int | Literal["model"] | None = None
    if proc.memlock is not None:
        if proc.memlock.kind == "unlimited":
            memlock = -1
        elif proc.memlock.kind == "model":
            memlock = (
                "model"
                if workload.model_bytes is None
                else workload.model_bytes + MEMLOCK_MODEL_MARGIN
            )
        else:
            memlock = proc.memlock.bytes
    return LaunchSpec(
        user=proc.user,
        group=proc.group,
        oom_score_adj=proc.oom_score_adj,
        nice=proc.nice,
        memlock=memlock,
        env=dict(proc.env),
        affinity=affinity,
        on_governor_exit=proc.on_governor_exit,
        restart_max=proc.restart_max,
        restart_backoff_s=proc.restart_backoff.seconds,
    )
