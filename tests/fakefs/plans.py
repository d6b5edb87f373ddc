"""Hand-built Plans and tree snapshots for the fake-tree tests."""

from __future__ import annotations

from pathlib import Path

from governor.kernel import files
from governor.plan.model import (
    CgroupWrite,
    EnableControllers,
    EngineSpec,
    LaunchSpec,
    Plan,
    PrefetchSpec,
)

from .fakekernel import FakeKernelCgroupFs

SLICE = "governor.slice"
GROUP = "governor.slice/npu-chat"
LEAF = "governor.slice/npu-chat/engine"
CONTROLLERS = ("pids", "memory", "io", "cpu", "cpuset")
PAGE = 4096

# the npu-chat policy of design.md, page-rounded down as the compiler does
MEMORY_MIN = 1181114368  # 1.1 GiB
MEMORY_HIGH = 1717985280  # 1.6 GiB
MEMORY_MAX = 1932734464  # 1.8 GiB


def _w(cgroup: str, file: str, value: str, reason: str) -> CgroupWrite:
    return CgroupWrite(
        cgroup=cgroup, file=file, value=value, reason=reason, controller=files.controller_of(file)
    )


WRITES = (
    _w(GROUP, files.PIDS_MAX, "512", "process.tasks_max"),
    # memory.min protection is capped by every ancestor's memory.min, so the slice gets it too
    _w(SLICE, files.MEMORY_MIN, str(MEMORY_MIN), "memory.min"),
    _w(GROUP, files.MEMORY_MIN, str(MEMORY_MIN), "memory.min"),
    _w(GROUP, files.MEMORY_HIGH, str(MEMORY_HIGH), "memory.high"),
    _w(GROUP, files.MEMORY_MAX, str(MEMORY_MAX), "memory.max"),
    _w(GROUP, files.MEMORY_SWAP_MAX, "0", "memory.swap_max"),
    _w(GROUP, files.MEMORY_OOM_GROUP, "1", "memory.oom_group"),
    _w(GROUP, files.IO_WEIGHT, "default 200", "io.weight"),
    _w(GROUP, files.CPU_WEIGHT, "200", "cpu.weight"),
    _w(GROUP, files.CPU_MAX, "350000 100000", "cpu.max"),
    _w(GROUP, files.CPUSET_CPUS, "1-2", "cpu.cpus"),
)


def make_plan(
    *,
    writes: tuple[CgroupWrite, ...] = WRITES,
    controllers: tuple[str, ...] = CONTROLLERS,
    policy: str = "npu-chat",
    group: str = GROUP,
    leaf: str = LEAF,
) -> Plan:
    return Plan(
        policy=policy,
        cgroup_root="/sys/fs/cgroup",
        slice=SLICE,
        group=group,
        leaf=leaf,
        create=(SLICE, group, leaf),
        enable=(
            EnableControllers(cgroup="", controllers=controllers),
            EnableControllers(cgroup=SLICE, controllers=controllers),
            EnableControllers(cgroup=group, controllers=controllers),
        ),
        writes=writes,
        controllers=controllers,
        launch=LaunchSpec(),
        engine=EngineSpec(),
        prefetch=PrefetchSpec(),
        watch=(),
    )


def make_busy_tree(fs: FakeKernelCgroupFs) -> None:
    """A host where something already lives: root has cpu+memory on, the slice exists with
    memory on, a protected sibling policy, and a non-default slice memory.min."""
    fs.enable("", ["cpu", "memory"])
    fs.mkdir(SLICE)
    fs.enable(SLICE, ["memory"])
    fs.mkdir(f"{SLICE}/other")
    fs.write(f"{SLICE}/other", files.MEMORY_HIGH, "1048576")
    fs.write(SLICE, files.MEMORY_MIN, "65536")


def make_stale_tree(fs: FakeKernelCgroupFs) -> None:
    """A group left over from an earlier run with only memory on and other limits."""
    fs.enable("", ["memory"])
    for cgroup in (SLICE, GROUP, LEAF):
        fs.mkdir(cgroup)
    fs.enable(SLICE, ["memory"])
    fs.enable(GROUP, ["memory"])
    fs.write(GROUP, files.MEMORY_HIGH, "1073741824")
    fs.write(GROUP, files.MEMORY_MIN, "4096")
    fs.write(GROUP, files.MEMORY_OOM_GROUP, "1")


Snapshot = dict[str, str | None]


def snapshot(root: Path) -> Snapshot:
    """Every directory (None) and file (its content) below ``root``, by relative path.

    Contents are stripped: the kernel prints "max\n" after a write of "max", the fake keeps
    what was written.
    """
    out: Snapshot = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = None if path.is_dir() else path.read_text().strip()
    return out
