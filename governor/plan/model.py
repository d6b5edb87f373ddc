"""The Plan: what a policy means on one host, as ordered, printable, diffable data.

A Plan is produced by the pure compiler and consumed by every backend (cgroupfs, systemd,
drop-in renderer). Values are normalised the way the kernel reads them back, so ``observe`` can
compare the live files to the plan byte for byte.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CgroupWrite(_Frozen):
    """One write of one interface file; ``cgroup`` is relative to the cgroup2 root."""

    cgroup: str
    file: str  # kernel spelling, e.g. "memory.high"
    value: str  # exactly as written (and as the kernel reads it back)
    reason: str  # the policy field path that asked for it, e.g. "memory.high"
    controller: str | None  # None for core files (cgroup.*)


class EnableControllers(_Frozen):
    """Controllers to add to ``<cgroup>/cgroup.subtree_control`` (top-down order)."""

    cgroup: str  # relative to the cgroup2 root; "" is the root itself
    controllers: tuple[str, ...]


class LaunchSpec(_Frozen):
    """What the launcher does in the child before exec, resolved from [process]."""

    user: str | None = None
    group: str | None = None
    oom_score_adj: int | None = None
    nice: int | None = None
    # RLIMIT_MEMLOCK in bytes; None = leave as is; -1 = unlimited; "model" when it needs the
    # model's size and no workload was given to the compiler
    memlock: int | Literal["model"] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    affinity: tuple[int, ...] | None = None  # sched_setaffinity, matches cpuset.cpus
    on_governor_exit: Literal["kill", "keep"] = "kill"
    restart_max: int = 3  # `restart` action: relaunches per launch
    restart_backoff_s: float = 1.0  # wait before the first relaunch; doubles, capped at 60 s


class EngineSpec(_Frozen):
    kind: Literal["llama.cpp", "generic"] = "generic"
    max_context_tokens: int | None = None
    threads: int | None = None


class PrefetchSpec(_Frozen):
    files: Literal["auto"] | tuple[str, ...] = "auto"
    mode: Literal["none", "advise", "populate", "lock"] = "none"


class WatchTrigger(_Frozen):
    """A PSI trigger as the kernel takes it: "<some|full> <stall us> <window us>"."""

    resource: Literal["memory", "cpu", "io"]
    kind: Literal["some", "full"]
    stall_us: int
    window_us: int
    file: str  # "memory.pressure"
    system: bool = False  # armed on the cgroup root (= /proc/pressure), not on the group

    def trigger_text(self) -> str:
        return f"{self.kind} {self.stall_us} {self.window_us}"


class WatchCondition(_Frozen):
    """A non-PSI rule condition: a leak slope, the board-wide MemAvailable floor, or a
    memory.events counter that went up."""

    condition: Literal["leak", "memavailable", "event"]
    threshold: int = 0  # leak: bytes/s; memavailable: bytes
    window_s: float | None = None  # leak: the slope's window
    event: str | None = None  # event: the memory.events key ("oom_kill")
    file: str  # where it is read: "memory.stat", "/proc/meminfo", "memory.events"

    def text(self) -> str:
        if self.condition == "leak":
            return f"leak > {self.threshold}B/s for {self.window_s:g}s"
        if self.condition == "memavailable":
            return f"memavailable < {self.threshold}"
        return str(self.event)


class WatchRule(_Frozen):
    index: int  # position in the policy's [[pressure]] array
    trigger: WatchTrigger | WatchCondition
    hold_s: float | None = None  # "for"
    cooldown_s: float | None = None
    actions: tuple[str, ...]  # canonical action strings; parsed again by the monitor


class Plan(_Frozen):
    """Everything the backends need, from one policy on one host."""

    policy: str  # policy name
    source: str | None = None  # policy file it came from
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
    # memory.min/low the group asks for: a child's protection is capped by its parent's
    # (mm/memcontrol.c), so apply raises the slices above the group to the sum of their
    # children's values and remove lowers them back (backends/cgroupfs.py)
    protect_parents: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # resolutions worth telling the operator ("big" -> 4-7)
    degraded: tuple[str, ...] = ()  # limits NOT in force (allowed missing controllers)

    def writes_for(self, controller: str) -> tuple[CgroupWrite, ...]:
        return tuple(w for w in self.writes if w.controller == controller)
