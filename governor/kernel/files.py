"""Kernel file names, spelled once and in kernel spelling (Documentation/admin-guide/cgroup-v2.rst)."""

from __future__ import annotations

# core interface files
CGROUP_PROCS = "cgroup.procs"
CGROUP_THREADS = "cgroup.threads"
CGROUP_CONTROLLERS = "cgroup.controllers"
CGROUP_SUBTREE_CONTROL = "cgroup.subtree_control"
CGROUP_EVENTS = "cgroup.events"
CGROUP_KILL = "cgroup.kill"  # 5.14+
CGROUP_FREEZE = "cgroup.freeze"  # 5.2+
CGROUP_TYPE = "cgroup.type"

# memory controller
MEMORY_MIN = "memory.min"
MEMORY_LOW = "memory.low"
MEMORY_HIGH = "memory.high"
MEMORY_MAX = "memory.max"
MEMORY_SWAP_MAX = "memory.swap.max"
MEMORY_OOM_GROUP = "memory.oom.group"
MEMORY_CURRENT = "memory.current"
MEMORY_PEAK = "memory.peak"  # 5.19+
# written to memory.peak (6.12+): any non-empty string resets the writing fd's view only
PEAK_RESET = "reset\n"
MEMORY_EVENTS = "memory.events"
MEMORY_EVENTS_LOCAL = "memory.events.local"
MEMORY_STAT = "memory.stat"
MEMORY_RECLAIM = "memory.reclaim"  # 5.19+
MEMORY_PRESSURE = "memory.pressure"
MEMORY_SWAP_CURRENT = "memory.swap.current"
MEMORY_ZSWAP_CURRENT = "memory.zswap.current"  # 5.19+: the group's compressed zswap pool bytes
MEMORY_ZSWAP_MAX = "memory.zswap.max"  # 5.19+
MEMORY_ZSWAP_WRITEBACK = "memory.zswap.writeback"  # 6.8+: 0 keeps the group's pages off the device

# the policy's [memory] keys -> their files, in one table (compiler, status, metrics)
MEMORY_FILES: dict[str, str] = {
    "min": MEMORY_MIN,
    "low": MEMORY_LOW,
    "high": MEMORY_HIGH,
    "max": MEMORY_MAX,
    "swap_max": MEMORY_SWAP_MAX,
    "zswap_max": MEMORY_ZSWAP_MAX,
    "zswap_writeback": MEMORY_ZSWAP_WRITEBACK,
    "oom_group": MEMORY_OOM_GROUP,
}

# cpu / cpuset
CPU_WEIGHT = "cpu.weight"
CPU_MAX = "cpu.max"
CPU_STAT = "cpu.stat"
CPU_PRESSURE = "cpu.pressure"
CPUSET_CPUS = "cpuset.cpus"
CPUSET_MEMS = "cpuset.mems"
CPUSET_CPUS_EFFECTIVE = "cpuset.cpus.effective"

# io / pids
IO_WEIGHT = "io.weight"
IO_PRESSURE = "io.pressure"
PIDS_MAX = "pids.max"
PIDS_CURRENT = "pids.current"

# controllers, in the order runc writes them at runtime: pids -> memory -> io -> cpu -> cpuset
CONTROLLER_ORDER: tuple[str, ...] = ("pids", "memory", "io", "cpu", "cpuset")
# THE controller list: the controllers the governor uses. --allow-missing also takes "psi"
# (pressure stall information: a kernel feature the pressure rules need, not a controller)
# and "zswap" (memory.zswap.max 5.19+, memory.zswap.writeback 6.8+: left out on older kernels)
CONTROLLERS: frozenset[str] = frozenset(CONTROLLER_ORDER)
MISSABLE: frozenset[str] = CONTROLLERS | {"psi", "zswap"}


def controller_of(filename: str) -> str | None:
    """The controller that owns an interface file (``memory.high`` -> ``memory``), or None for core files."""
    prefix = filename.split(".", 1)[0]
    return None if prefix == "cgroup" else prefix


# the v1-only knob the seed article asks for; rejected by the policy loader with v2 equivalents
V1_OOM_KILL_DISABLE = "memory.oom_kill_disable"
