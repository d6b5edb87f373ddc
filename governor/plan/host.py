"""HostFacts: what this host supports, probed once from /proc and /sys under an injected root.

``probe()`` is the only I/O the plan package does; everything downstream (``compile``,
``diagnose``) is pure and takes a ``HostFacts``. A missing cgroup2 or PSI is a fact recorded
here, not an error; HostError is raised only when probing itself is impossible.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar

from governor.errors import HostError
from governor.kernel import parse
from governor.kernel.clocks import ClockDevice, discover
from governor.kernel.files import CGROUP_CONTROLLERS, CGROUP_SUBTREE_CONTROL
from governor.record import asdict, fields, record

# files probed, relative to the probed root (proc(5), sysfs-devices-system-cpu ABI)
PROC_MOUNTINFO = "proc/self/mountinfo"
PROC_MEMINFO = "proc/meminfo"
PROC_SMAPS = "proc/self/smaps"
PROC_OSRELEASE = "proc/sys/kernel/osrelease"
PROC_PRESSURE_MEMORY = "proc/pressure/memory"
PROC_PID1_COMM = "proc/1/comm"
SYS_CPU = "sys/devices/system/cpu"
SYS_CPU_ONLINE = "sys/devices/system/cpu/online"
SYS_CPU_POSSIBLE = "sys/devices/system/cpu/possible"
SYS_NODE_ONLINE = "sys/devices/system/node/online"
CPU_CAPACITY = "cpu_capacity"  # arm64/riscv topology; x86 hybrid since 6.x
CPUFREQ_MAX = "cpufreq/cpuinfo_max_freq"

CGROUP_FS_ROOT = "/sys/fs/cgroup"
# where systemd puts cgroup2 in "hybrid" mode (systemd.unified_cgroup_hierarchy=0)
CGROUP_HYBRID_UNIFIED = "/sys/fs/cgroup/unified"

# libsystemd-shared-NNN.so names the systemd version; Debian 12 moved it to the multiarch dir
SYSTEMD_SHARED_GLOBS = (
    "usr/lib/systemd/libsystemd-shared-*.so",
    "lib/systemd/libsystemd-shared-*.so",
    "usr/lib/*/systemd/libsystemd-shared-*.so",
    "lib/*/systemd/libsystemd-shared-*.so",
)
_SYSTEMD_SHARED = re.compile(r"libsystemd-shared-([0-9]+)")
_SYSTEMD_VERSION_LINE = re.compile(r"systemd ([0-9]+)\b")
_KERNEL_RELEASE = re.compile(r"([0-9]+)\.([0-9]+)")
_SYSTEMCTL_TIMEOUT_S = 5.0

# cgroup v1 subsystem names as they appear in mount options (kernel/cgroup/cgroup.c, cgroup_subsys)
V1_SUBSYSTEMS = frozenset(
    {
        "cpuset",
        "cpu",
        "cpuacct",
        "io",
        "blkio",
        "memory",
        "devices",
        "freezer",
        "net_cls",
        "net_prio",
        "perf_event",
        "hugetlb",
        "pids",
        "rdma",
        "misc",
    }
)

# the io controller's v1 name (block/blk-cgroup.c, io_cgrp_subsys.legacy_name)
V1_TO_V2 = {"blkio": "io"}

CgroupLayout = Literal["unified", "hybrid", "legacy", "none"]


@record(frozen=True)
class CgroupLevel:
    """An existing cgroup on the way to the target, relative to the cgroup2 mount."""

    path: str
    controllers: frozenset[str]
    subtree_control: frozenset[str]


@record(frozen=True)
class CoreTypes:
    """big.LITTLE clusters among online CPUs; ``big`` holds every class above the lowest."""

    little: tuple[int, ...]
    big: tuple[int, ...]
    source: Literal["cpu_capacity", "cpufreq"]


@record(frozen=True)
class HostFacts:
    """Everything the pure compiler and doctor need to know about the host (stdlib only: the
    run time probes it at every launch to find its compiled plan)."""

    root: str
    cgroup_mount: str | None
    cgroup_layout: CgroupLayout
    controllers: frozenset[str]
    subtree_control: frozenset[str]
    v1_controllers: frozenset[str]  # bound to a v1 hierarchy, in cgroup2 spelling (blkio -> io)
    cpus_online: tuple[int, ...]
    cpus_possible: tuple[int, ...]
    core_types: CoreTypes | None
    mem_total: int
    mem_available: int | None
    page_size: int
    kernel_release: str
    kernel_version: tuple[int, int]
    psi: bool
    psi_detail: str
    pid1: str  # "" when /proc/1 is hidden (hidepid=)
    systemd_version: int | None
    euid: int
    path: tuple[CgroupLevel, ...] = ()
    numa_nodes: tuple[int, ...] = (0,)
    clocks: tuple[ClockDevice, ...] = ()  # cpufreq policies and devfreq devices ([clocks])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: sets as sorted lists, tuples as lists."""
        return _jsonable(asdict(self))  # type: ignore[no-any-return]  # a dict in, a dict out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostFacts:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown host fact(s): {', '.join(sorted(unknown))}")
        sets = ("controllers", "subtree_control", "v1_controllers")
        tuples = ("cpus_online", "cpus_possible", "kernel_version", "numa_nodes")
        out = dict(d)
        for k in sets:
            out[k] = frozenset(d[k])
        for k in tuples:
            if k in d:
                out[k] = tuple(d[k])
        out["path"] = tuple(
            CgroupLevel(
                path=lv["path"],
                controllers=frozenset(lv["controllers"]),
                subtree_control=frozenset(lv["subtree_control"]),
            )
            for lv in d.get("path", ())
        )
        out["clocks"] = tuple(ClockDevice.from_dict(c) for c in d.get("clocks", ()))
        ct = d.get("core_types")
        out["core_types"] = (
            None
            if ct is None
            else CoreTypes(little=tuple(ct["little"]), big=tuple(ct["big"]), source=ct["source"])
        )
        return cls(**out)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


# --- reading ---------------------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as err:
        raise HostError(
            f"cannot probe host: {err.strerror or err} ({path})",
            hint="run on Linux with /proc and /sys mounted",
        ) from err


def _read_optional(path: Path) -> str | None:
    """The file's text, or None when it does not exist (an absent feature is a fact)."""
    try:
        return path.read_text(encoding="utf-8", errors="surrogateescape")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise HostError(f"cannot probe host: {err.strerror or err} ({path})") from err


_T = TypeVar("_T")


def _parse_file(path: Path, parser: Callable[[str], _T], text: str | None = None) -> _T:
    """Read (unless ``text`` is given) and parse; both failures become a HostError with the path."""
    body = _read(path) if text is None else text
    try:
        return parser(body)
    except ValueError as err:
        raise HostError(f"cannot probe host: {err} ({path})") from err


def _rebase(root: Path, absolute: str) -> Path:
    return root / absolute.lstrip("/")


# --- cgroup mounts -----------------------------------------------------------------------------


def _v1_subsystems(mount: parse.Mount) -> frozenset[str]:
    # v1 controllers are superblock options ("rw,cpu,cpuacct"); "name=systemd" binds none
    return frozenset(V1_TO_V2.get(o, o) for o in mount.super_options if o in V1_SUBSYSTEMS)


def _cgroup2_mount(mounts: Iterable[parse.Mount]) -> parse.Mount | None:
    found = [m for m in mounts if m.fstype == "cgroup2"]
    for preferred in (CGROUP_FS_ROOT, CGROUP_HYBRID_UNIFIED):
        for mount in found:
            if mount.mount_point == preferred:
                return mount
    return found[0] if found else None


def _layout(has_cgroup2: bool, has_v1: bool) -> CgroupLayout:
    if has_cgroup2:
        return "hybrid" if has_v1 else "unified"
    return "legacy" if has_v1 else "none"


def _levels(mount: Path, target: str) -> tuple[CgroupLevel, ...]:
    parts = [p for p in target.strip("/").split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"target cgroup path must not contain '.' or '..': {target!r}")
    levels: list[CgroupLevel] = []
    for depth in range(1, len(parts) + 1):
        rel = "/".join(parts[:depth])
        directory = mount / rel
        if not directory.is_dir():
            break
        levels.append(
            CgroupLevel(
                path=rel,
                controllers=_parse_file(directory / CGROUP_CONTROLLERS, parse.parse_controllers),
                subtree_control=_parse_file(
                    directory / CGROUP_SUBTREE_CONTROL, parse.parse_controllers
                ),
            )
        )
    return tuple(levels)


# --- CPUs ----------------------------------------------------------------------------------------


def _per_cpu_values(root: Path, cpus: Iterable[int], name: str) -> dict[int, int] | None:
    """``cpuN/<name>`` for every CPU, or None when any of them lacks it."""
    values: dict[int, int] = {}
    for cpu in cpus:
        path = root / SYS_CPU / f"cpu{cpu}" / name
        text = _read_optional(path)
        if text is None:
            return None
        values[cpu] = _parse_file(path, int, text.strip())
    return values


def _split_classes(values: dict[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    if len(set(values.values())) < 2:
        return None
    lowest = min(values.values())
    little = tuple(sorted(c for c, v in values.items() if v == lowest))
    big = tuple(sorted(c for c, v in values.items() if v != lowest))
    return little, big


def _core_types(root: Path, online: tuple[int, ...]) -> CoreTypes | None:
    # cpu_capacity is the scheduler's view (capacity-dmips-mhz scaled by max frequency); when it
    # is absent or flat (no capacity-dmips-mhz in the device tree) cpufreq tells clusters apart
    sources: tuple[tuple[Literal["cpu_capacity", "cpufreq"], str], ...] = (
        ("cpu_capacity", CPU_CAPACITY),
        ("cpufreq", CPUFREQ_MAX),
    )
    for source, name in sources:
        values = _per_cpu_values(root, online, name)
        split = _split_classes(values) if values else None
        if split is not None:
            return CoreTypes(little=split[0], big=split[1], source=source)
    return None


# --- small facts ---------------------------------------------------------------------------------


def _page_size(root: Path, live: bool) -> int:
    path = root / PROC_SMAPS
    try:
        with path.open(encoding="utf-8", errors="surrogateescape") as smaps:
            for line in smaps:  # the kernel renders smaps lazily: stop at the first mapping
                if line.startswith("KernelPageSize:"):
                    return _parse_file(path, parse.parse_meminfo, line)["KernelPageSize"]
    except OSError as err:
        if not live:
            raise HostError(f"cannot probe host: {err.strerror or err} ({path})") from err
    if live:
        return os.sysconf("SC_PAGE_SIZE")
    raise HostError(f"cannot probe host: no KernelPageSize line ({path})")


def _kernel_version(release: str) -> tuple[int, int]:
    match = _KERNEL_RELEASE.match(release)
    if match is None:
        raise ValueError(f"unrecognised kernel release {release!r}")
    return int(match[1]), int(match[2])


def _psi(root: Path) -> tuple[bool, str]:
    # psi_proc_init() creates /proc/pressure only when PSI is enabled, so a missing file means
    # CONFIG_PSI=n or psi disabled at boot; older kernels keep the files and fail with EOPNOTSUPP
    path = root / PROC_PRESSURE_MEMORY
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False, f"{path} missing: PSI disabled at boot or kernel built without CONFIG_PSI"
    except OSError as err:
        if err.errno == errno.EOPNOTSUPP:
            return False, f"{path}: EOPNOTSUPP: PSI disabled at boot"
        return False, f"{path}: {err.strerror or err}"
    try:
        parse.parse_psi(text)
    except ValueError as err:
        return False, f"{path}: {err}"
    return True, f"{path} readable"


def _systemd_version(root: Path, live: bool) -> int | None:
    versions = [
        int(match[1])
        for pattern in SYSTEMD_SHARED_GLOBS
        for lib in root.glob(pattern)
        if (match := _SYSTEMD_SHARED.match(lib.name))
    ]
    if versions:
        return max(versions)
    if not live:
        return None
    import subprocess  # rare: no libsystemd-shared found (systemd is PID 1 here)

    try:
        out = subprocess.run(
            ["systemctl", "--version"],
            capture_output=True,
            text=True,
            check=True,
            timeout=_SYSTEMCTL_TIMEOUT_S,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = _SYSTEMD_VERSION_LINE.match(out)
    return int(match[1]) if match else None


# --- probe ---------------------------------------------------------------------------------------


def probe(
    root: str | Path = "/",
    *,
    cgroup_root: str | Path | None = None,
    target: str | None = None,
    sysfs_root: str | Path | None = None,
) -> HostFacts:
    """Read /proc and /sys under ``root``; ``cgroup_root`` overrides the cgroup2 mount location,
    ``sysfs_root`` the sysfs tree the board's clocks are found in (``root``/sys).

    ``target`` is a cgroup path below the cgroup2 root (``governor.slice/npu-chat``); the cgroups
    that already exist along it are recorded in ``HostFacts.path``. Never writes anything.
    """
    base = Path(root)
    live = base == Path("/")

    mounts = _parse_file(base / PROC_MOUNTINFO, parse.parse_mountinfo)
    v1_mounts = [m for m in mounts if m.fstype == "cgroup"]
    v1_controllers = frozenset().union(*(_v1_subsystems(m) for m in v1_mounts))
    cgroup2 = _cgroup2_mount(mounts)

    mount: Path | None
    if cgroup_root is not None:
        mount = Path(cgroup_root)
    elif cgroup2 is not None:
        mount = _rebase(base, cgroup2.mount_point)
    else:
        mount = None
    layout = _layout(mount is not None, bool(v1_mounts))

    controllers: frozenset[str] = frozenset()
    subtree_control: frozenset[str] = frozenset()
    levels: tuple[CgroupLevel, ...] = ()
    if mount is not None:
        controllers = _parse_file(mount / CGROUP_CONTROLLERS, parse.parse_controllers)
        subtree_control = _parse_file(mount / CGROUP_SUBTREE_CONTROL, parse.parse_controllers)
        if target is not None:
            levels = _levels(mount, target)

    online = _parse_file(base / SYS_CPU_ONLINE, parse.parse_cpulist)
    possible = _parse_file(base / SYS_CPU_POSSIBLE, parse.parse_cpulist)

    meminfo = _parse_file(base / PROC_MEMINFO, parse.parse_meminfo)
    if "MemTotal" not in meminfo:
        raise HostError(f"cannot probe host: no MemTotal ({base / PROC_MEMINFO})")

    release = _read(base / PROC_OSRELEASE).strip()
    psi, psi_detail = _psi(base)

    comm = _read_optional(base / PROC_PID1_COMM)
    pid1 = comm.strip() if comm is not None else ""
    node_text = _read_optional(base / SYS_NODE_ONLINE)
    numa_nodes = (
        _parse_file(base / SYS_NODE_ONLINE, parse.parse_cpulist, node_text) if node_text else (0,)
    )

    return HostFacts(
        root=str(base),
        cgroup_mount=str(mount) if mount is not None else None,
        cgroup_layout=layout,
        controllers=controllers,
        subtree_control=subtree_control,
        v1_controllers=v1_controllers,
        path=levels,
        cpus_online=online,
        cpus_possible=possible,
        core_types=_core_types(base, online),
        mem_total=meminfo["MemTotal"],
        mem_available=meminfo.get("MemAvailable"),
        page_size=_page_size(base, live),
        kernel_release=release,
        kernel_version=_parse_file(base / PROC_OSRELEASE, _kernel_version, release),
        psi=psi,
        psi_detail=psi_detail,
        pid1=pid1,
        systemd_version=_systemd_version(base, live) if pid1 == "systemd" else None,
        numa_nodes=numa_nodes,
        euid=os.geteuid() if live else 0,
        clocks=discover(Path(sysfs_root) if sysfs_root is not None else base / "sys"),
    )
