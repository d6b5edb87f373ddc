"""The compiled plan: what a policy means on one host, as ordered, printable, diffable data.

The compiler (compile time: pydantic policy, host facts) produces a Plan; everything at run
time (backends, launcher, monitor, actions) reads only the Plan. It is plain frozen
dataclasses and the standard library, so the run time never imports pydantic, and it is the
whole intermediate form: ``to_json()`` / ``from_json()`` round-trip it (the plan cache, `governor
plan --json`, the runtime state under /run/governor). ``FORMAT`` is bumped when the shape
changes; a cached plan of another format is recompiled.

Values are normalised the way the kernel reads them back, so ``observe`` can compare the live
files to the plan byte for byte.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

from governor.monitor import triggers
from governor.record import asdict, field, record

FORMAT = 2  # 1: the pydantic Plan of wave 1; 2: dataclasses, typed actions, rule texts

ActionVerb = str  # a verb of governor/monitor/actions/registry.py (the policy parser checks it)
QosClass = Literal["background", "standard", "interactive"]


class ShedStep(StrEnum):
    """A step of a `shed` (governor/monitor/actions/shedder.py) as its victim's journal spells
    it: the ladder's five, then the undo's. ``unload`` (issue 38) stops a router victim's least
    recently used idle model: it holds nothing, the model loads again at its next request."""

    UNLOAD = "unload"
    THROTTLE = "throttle"
    FREEZE = "freeze"
    STOP = "stop"
    KILL = "kill"
    THAW = "thaw"
    RAISE = "raise"
    RELEASE = "release"


# the ladder's steps on any cgroup, mildest first (a board file's ungoverned cgroup yields these)
CGROUP_STEPS: tuple[str, ...] = (ShedStep.THROTTLE, ShedStep.FREEZE, ShedStep.STOP, ShedStep.KILL)
# the shed ladder of a governed slice: a router's idle model goes first (a slice that is no
# router passes over it); [qos] yield picks a subset, taken in this order
SHED_STEPS: tuple[str, ...] = (ShedStep.UNLOAD, *CGROUP_STEPS)
QOS_RANK = {"background": 0, "standard": 1, "interactive": 2}


@record(frozen=True)
class CgroupWrite:
    """One write of one interface file; ``cgroup`` is relative to the cgroup2 root."""

    cgroup: str
    file: str  # kernel spelling, e.g. "memory.high"
    value: str  # exactly as written (and as the kernel reads it back)
    reason: str  # the policy field path that asked for it, e.g. "memory.high"
    controller: str | None  # None for core files (cgroup.*)


@record(frozen=True)
class EnableControllers:
    """Controllers to add to ``<cgroup>/cgroup.subtree_control`` (top-down order)."""

    cgroup: str  # relative to the cgroup2 root; "" is the root itself
    controllers: tuple[str, ...]


@record(frozen=True)
class LaunchSpec:
    """What the launcher does in the child before exec, resolved from [process]."""

    user: str | None = None
    group: str | None = None
    oom_score_adj: int | None = None
    nice: int | None = None
    # RLIMIT_MEMLOCK in bytes; None = leave as is; -1 = unlimited; "model" when it needs the
    # model's size and no workload was given to the compiler
    memlock: int | Literal["model"] | None = None
    env: dict[str, str] = field(default_factory=dict)
    affinity: tuple[int, ...] | None = None  # sched_setaffinity, matches cpuset.cpus
    on_governor_exit: Literal["kill", "keep"] = "kill"
    restart_max: int = 3  # `restart` action: relaunches per launch
    restart_backoff_s: float = 1.0  # wait before the first relaunch; doubles, capped at 60 s


@record(frozen=True)
class DeviceSpec:
    """[device]: the device memory the engine needs (bytes; "model" until the model file's
    size is known), the pool it comes from, and the field that asked for it."""

    memory: int | Literal["model"]
    pool: Literal["system", "cma"] = "system"
    reason: str = "device.memory"


@record(frozen=True)
class RouterModelSpec:
    """[engine.models.<alias>]: one router model's leaf limits in bytes (None: not set)."""

    alias: str
    max: int | None = None
    high: int | None = None
    oom_group: bool | None = None


def _engine(d: dict[str, Any]) -> EngineSpec:
    models = tuple(RouterModelSpec(**m) for m in d.get("models", ()))
    return EngineSpec(**{**d, "models": models})


@record(frozen=True)
class EngineSpec:
    kind: Literal["llama.cpp", "rkllm", "generic"] = "generic"
    max_context_tokens: int | None = None
    max_cache_ram: int | None = None  # MiB (llama-server --cache-ram cap)
    threads: int | None = None
    ready: str | None = None  # URL answering 200 once the engine is ready, or "exec"
    ready_timeout_s: float = 300.0
    probe_generate_s: float | None = None  # one token asked every interval (None: off)
    evict: Literal["count", "memory"] = "count"  # llama-server's router: who makes room
    models: tuple[RouterModelSpec, ...] = ()


@record(frozen=True)
class PrefetchSpec:
    files: Literal["auto"] | tuple[str, ...] = "auto"
    mode: Literal["none", "advise", "populate", "lock"] = "none"


@record(frozen=True)
class QosSpec:
    """[qos]: the slice's class among the board's workloads and the shed steps another
    policy's `shed` may take on it (``yields``: the policy's ``yield``)."""

    qos_class: QosClass = "standard"
    yields: tuple[str, ...] = SHED_STEPS
    # [qos] admit and admit_timeout (issue 36, governor/board/budget.py): left out of the JSON
    # at their defaults, so plans without them keep their shape (goldens, caches)
    admit: Literal["warn", "refuse", "wait", "shed"] = "warn"
    admit_timeout_s: float = 60.0

    def to_json(self) -> dict[str, Any]:
        """As the policy spells it (the run state's ``qos``)."""
        return {"class": self.qos_class, "yield": list(self.yields)}


@record(frozen=True)
class WatchTrigger:
    """A PSI trigger as the kernel takes it: "<some|full> <stall us> <window us>"."""

    resource: Literal["memory", "cpu", "io"]
    kind: Literal["some", "full"]
    stall_us: int
    window_us: int
    file: str  # "memory.pressure"
    system: bool = False  # armed on the cgroup root (= /proc/pressure), not on the group

    def trigger_text(self) -> str:
        return f"{self.kind} {self.stall_us} {self.window_us}"


@record(frozen=True)
class WatchCondition:
    """A non-PSI rule condition: a leak slope, the board-wide MemAvailable floor (``available``:
    less the group's page cache its memory.min protects), the board's available memory below the
    slice's headroom (``headroom``: claimed peak less memory.current; available less the board's
    reserve too), or a memory.events counter that went up."""

    condition: str  # a kind of governor/monitor/triggers.py ("leak", "headroom", "event"...)
    file: str  # where it is read: "memory.stat", "/proc/meminfo", "memory.events", fdinfo
    # leak: bytes/s; memavailable, device: bytes; headroom: the slice's claimed peak (its
    # memory.max, else memory.high; the engine's estimate replaces it at launch); refaults:
    # the share in 1/100 of a percent
    threshold: int = 0
    window_s: float | None = None  # leak: the slope's window; refaults: the window
    event: str | None = None  # event: the memory.events key ("oom_kill")

    def text(self) -> str:
        return triggers.plan_text(self.condition, self.threshold, self.window_s, self.event)


@record(frozen=True)
class Action:
    """One action of a rule, compiled: every value is what the executor writes or waits.

    ``text`` is the canonical spelling the policy language gives it (``str()``)."""

    verb: ActionVerb
    text: str
    signal: str | None = None  # "SIGUSR1"
    bytes: int | None = None  # reclaim: amount; set: an absolute memory size (None: "max")
    file: str | None = None  # set: the interface file
    value: str | None = None  # set: the absolute value as the kernel takes it
    relative_percent: str | None = None  # set: "+10" / "-12.5" (exact decimal text)
    duration_s: float | None = None  # freeze
    argv: tuple[str, ...] = ()  # exec
    swappiness: int | None = None  # reclaim: memory.reclaim's swappiness= (None: not given)

    def __str__(self) -> str:
        return self.text


@record(frozen=True)
class WatchRule:
    index: int  # position in the policy's [[pressure]] array
    trigger: WatchTrigger | WatchCondition
    when: str  # the condition as the policy spells it ("memory some 150ms/2s")
    actions: tuple[Action, ...]
    hold_s: float | None = None  # "for"
    cooldown_s: float | None = None


@record(frozen=True)
class ClockWrite:
    """One write of a clock file (governor/kernel/clocks.py), in the order of the plan."""

    file: str  # relative to the device's directory: "scaling_governor", "min_freq"
    value: str  # as the kernel reads it back
    reason: str  # the policy field: "clocks.big.min"


@record(frozen=True)
class ClockTarget:
    """One board clock a policy sets ([clocks]): board-wide, shared by rule (backends/clocks.py)."""

    key: str  # the policy's key: big, little, npu, gpu, dmc
    kind: str  # cpufreq | devfreq
    name: str  # policy4, fdab0000.npu
    path: str  # the device's directory, absolute: also its identity on the board
    writes: tuple[ClockWrite, ...]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClockTarget:
        return cls(
            key=d["key"],
            kind=d["kind"],
            name=d["name"],
            path=d["path"],
            writes=tuple(ClockWrite(**w) for w in d["writes"]),
        )


@record(frozen=True)
class Plan:
    """Everything the backends need, from one policy on one host."""

    policy: str  # policy name
    cgroup_root: str  # mount point of cgroup2 on the host the plan was compiled for
    slice: str  # parent slice, e.g. "governor.slice"
    group: str  # "<slice>/<name>": where the limits live
    leaf: str  # "<slice>/<name>/engine": where processes live
    create: tuple[str, ...]  # directories to create, top-down
    enable: tuple[EnableControllers, ...]
    writes: tuple[CgroupWrite, ...]  # ordered pids -> memory -> io -> cpu -> cpuset
    controllers: tuple[str, ...]  # every controller the plan needs, in write order
    launch: LaunchSpec
    engine: EngineSpec
    prefetch: PrefetchSpec
    watch: tuple[WatchRule, ...]
    source: str | None = None  # policy file it came from
    # memory.min/low the group asks for: a child's protection is capped by its parent's
    # (mm/memcontrol.c), so apply raises the slices above the group to the sum of their
    # children's values and remove lowers them back (backends/cgroupfs.py)
    protect_parents: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # resolutions worth telling the operator ("big" -> 4-7)
    degraded: tuple[str, ...] = ()  # limits NOT in force (allowed missing controllers)
    device: DeviceSpec | None = None  # [device] (left out of the JSON when None)
    clocks: tuple[ClockTarget, ...] = ()  # [clocks]: board clocks set while the slice lives
    qos: QosSpec = field(default_factory=QosSpec)
    format: int = FORMAT

    def limit(self, file: str) -> int | None:
        """The bytes (or count) the plan writes to ``file`` on its group; None for "max" or
        when the plan does not write it. The one place a limit is read back from a plan."""
        for w in self.writes:
            if w.cgroup == self.group and w.file == file:
                return None if w.value == "max" else int(w.value.split()[0])
        return None

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        if out.get("device") is None:
            out.pop("device", None)  # plans without [device] keep their shape (goldens, caches)
        if not self.clocks:  # a plan without [clocks] reads as it did before them
            del out["clocks"]
        for rule in out["watch"]:  # a reclaim without swappiness= keeps the plan's shape
            for act in rule["actions"]:
                if act.get("swappiness") is None:
                    act.pop("swappiness", None)
        qos = out["qos"]
        if qos["admit"] == "warn" and qos["admit_timeout_s"] == 60.0:
            del qos["admit"], qos["admit_timeout_s"]
        return out

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """The inverse of :meth:`to_dict`; ValueError for another format or a bad shape."""
        if not isinstance(d, dict):
            raise ValueError(f"not a compiled plan: a JSON {type(d).__name__}, not an object")
        if d.get("format") != FORMAT:
            raise ValueError(f"plan format {d.get('format')!r}, this governor reads {FORMAT}")
        try:
            launch = dict(d["launch"])
            if launch.get("affinity") is not None:
                launch["affinity"] = tuple(launch["affinity"])
            prefetch = dict(d["prefetch"])
            if prefetch.get("files") != "auto":
                prefetch["files"] = tuple(prefetch["files"])
            return cls(
                policy=d["policy"],
                source=d.get("source"),
                cgroup_root=d["cgroup_root"],
                slice=d["slice"],
                group=d["group"],
                leaf=d["leaf"],
                create=tuple(d["create"]),
                enable=tuple(
                    EnableControllers(cgroup=e["cgroup"], controllers=tuple(e["controllers"]))
                    for e in d["enable"]
                ),
                writes=tuple(CgroupWrite(**w) for w in d["writes"]),
                controllers=tuple(d["controllers"]),
                launch=LaunchSpec(**launch),
                engine=_engine(d["engine"]),
                prefetch=PrefetchSpec(**prefetch),
                watch=tuple(_watch_rule(w) for w in d["watch"]),
                protect_parents=tuple(d.get("protect_parents", ())),
                notes=tuple(d.get("notes", ())),
                degraded=tuple(d.get("degraded", ())),
                device=DeviceSpec(**d["device"]) if d.get("device") else None,
                clocks=tuple(ClockTarget.from_dict(c) for c in d.get("clocks", ())),
                qos=_qos(d.get("qos")),
                format=d["format"],
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a compiled plan: {err!r}") from err


def _qos(d: dict[str, Any] | None) -> QosSpec:
    if not d:
        return QosSpec()
    return QosSpec(
        qos_class=d["qos_class"],
        yields=tuple(d["yields"]),
        admit=d.get("admit", "warn"),
        admit_timeout_s=float(d.get("admit_timeout_s", 60.0)),
    )


def _watch_rule(d: dict[str, Any]) -> WatchRule:
    t = d["trigger"]
    trigger: WatchTrigger | WatchCondition = (
        WatchTrigger(**t) if "stall_us" in t else WatchCondition(**t)
    )
    return WatchRule(
        index=d["index"],
        trigger=trigger,
        when=d["when"],
        actions=tuple(Action(**{**a, "argv": tuple(a.get("argv", ()))}) for a in d["actions"]),
        hold_s=d.get("hold_s"),
        cooldown_s=d.get("cooldown_s"),
    )
