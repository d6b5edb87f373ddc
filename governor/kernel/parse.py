"""Pure parsers of kernel text: text in, values out, no I/O.

Readers elsewhere take paths and call these. Every parser raises ``ValueError`` with a short
message on malformed input. Formats follow Documentation/admin-guide/cgroup-v2.rst ("Interface
Files": flat keyed, nested keyed, "max"), accounting/psi.rst and proc(5) (mountinfo, meminfo).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from governor.record import record

MAX = "max"  # the kernel's spelling of "no limit" in memory.*, pids.max, cpu.max

_UINT = re.compile(r"[0-9]+")
_INT = re.compile(r"-?[0-9]+")
_CONTROLLER = re.compile(r"[a-z][a-z0-9_]*")
# mountinfo escapes space, tab, newline and backslash as \ooo (fs/proc_namespace.c, mangle())
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _uint(token: str, what: str) -> int:
    if not _UINT.fullmatch(token):
        raise ValueError(f"{what}: expected an unsigned integer, got {token!r}")
    return int(token)


# --- cpulist (cpuset.cpus, /sys/devices/system/cpu/online, node/online) ---------------------


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,6\\n"`` -> ``(0, 1, 2, 3, 6)``; ``""`` -> ``()``. Sorted, unique."""
    body = text.strip()
    if not body:
        return ()
    cpus: set[int] = set()
    for item in body.split(","):
        lo_text, sep, hi_text = item.partition("-")
        lo = _uint(lo_text, "cpulist")
        hi = _uint(hi_text, "cpulist") if sep else lo
        if hi < lo:
            raise ValueError(f"cpulist: descending range {item!r}")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Canonical list as the kernel prints cpuset.cpus (``%*pbl``): ``"0-3,6"``; ``""`` if empty."""
    ordered = sorted(set(cpus))
    if ordered and ordered[0] < 0:
        raise ValueError(f"cpulist: negative cpu {ordered[0]}")
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# --- "max" <-> int | None: the one place --------------------------------------------------------


def parse_max(text: str) -> int | None:
    """``"max"`` -> None, ``"123"`` -> 123 (memory.high, memory.max, pids.max, ...)."""
    token = text.strip()
    if token == MAX:
        return None
    return _uint(token, "limit")


def format_max(value: int | None) -> str:
    """None -> ``"max"``, 123 -> ``"123"``. The inverse of :func:`parse_max`."""
    if value is None:
        return MAX
    if isinstance(value, bool) or value < 0:
        raise ValueError(f"limit: expected a non-negative integer or None, got {value!r}")
    return str(value)


def parse_cpu_max(text: str) -> tuple[int | None, int]:
    """cpu.max ``"$MAX $PERIOD"``: ``"max 100000"`` -> ``(None, 100000)``."""
    fields = text.split()
    if len(fields) != 2:
        raise ValueError(f"cpu.max: expected '$MAX $PERIOD', got {text.strip()!r}")
    quota = parse_max(fields[0])
    period = _uint(fields[1], "cpu.max period")
    if period == 0:
        raise ValueError("cpu.max: period must be positive")
    return quota, period


def format_cpu_max(quota: int | None, period: int) -> str:
    """``(None, 100000)`` -> ``"max 100000"``; the inverse of :func:`parse_cpu_max`."""
    if period <= 0:
        raise ValueError(f"cpu.max: period must be positive, got {period}")
    return f"{format_max(quota)} {period}"


# --- keyed files ---------------------------------------------------------------------------------


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``"key value"`` lines (memory.events, memory.stat, cpu.stat, cgroup.events)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2 or not _INT.fullmatch(fields[1]):
            raise ValueError(f"flat keyed: expected 'key value', got {line!r}")
        key = fields[0]
        if key in out:
            raise ValueError(f"flat keyed: duplicate key {key!r}")
        out[key] = int(fields[1])
    return out


def parse_controllers(text: str) -> frozenset[str]:
    """Space-separated controller names (cgroup.controllers, cgroup.subtree_control)."""
    names = text.split()
    for name in names:
        if not _CONTROLLER.fullmatch(name):
            raise ValueError(f"controllers: bad controller name {name!r}")
    return frozenset(names)


# --- PSI -----------------------------------------------------------------------------------------


@record(frozen=True)
class PsiLine:
    avg10: float
    avg60: float
    avg300: float
    total: int  # cumulative stall time in microseconds


@record(frozen=True)
class Psi:
    some: PsiLine
    full: PsiLine | None  # cpu.pressure has no "full" line before 5.13


_PSI_KEYS = ("avg10", "avg60", "avg300", "total")


def _parse_psi_line(fields: list[str]) -> PsiLine:
    values: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key not in _PSI_KEYS or key in values:
            raise ValueError(f"psi: unexpected field {field!r}")
        values[key] = value
    if len(values) != len(_PSI_KEYS):
        raise ValueError(f"psi: missing fields {sorted(set(_PSI_KEYS) - values.keys())}")
    try:
        avgs = [float(values[k]) for k in ("avg10", "avg60", "avg300")]
    except ValueError as err:
        raise ValueError(f"psi: bad average in {' '.join(fields)!r}") from err
    return PsiLine(avgs[0], avgs[1], avgs[2], _uint(values["total"], "psi total"))


def parse_psi(text: str) -> Psi:
    """``/proc/pressure/*`` and ``<cgroup>/*.pressure``: a ``some`` line and maybe ``full``."""
    lines: dict[str, PsiLine] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, *fields = line.split()
        if kind not in ("some", "full") or kind in lines:
            raise ValueError(f"psi: unexpected line {line!r}")
        lines[kind] = _parse_psi_line(fields)
    if "some" not in lines:
        raise ValueError("psi: no 'some' line")
    return Psi(some=lines["some"], full=lines.get("full"))


# --- mountinfo -------------------------------------------------------------------------------


@record(frozen=True)
class Mount:
    mount_id: int
    parent_id: int
    major_minor: str
    root: str  # path inside the filesystem that forms the root of this mount
    mount_point: str  # relative to the reading process's root
    options: tuple[str, ...]  # per-mount options
    optional_fields: tuple[str, ...]  # "shared:1", "master:2", ...
    fstype: str
    source: str
    super_options: tuple[str, ...]  # per-superblock options; cgroup v1 controllers live here


def _unescape(field: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """``/proc/<pid>/mountinfo`` (proc(5)): optional fields end at the ``-`` separator."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            raise ValueError(f"mountinfo: no ' - ' separator in {line!r}") from None
        if len(fields) - sep - 1 != 3:
            raise ValueError(f"mountinfo: expected 'fstype source options' in {line!r}")
        fstype, source, super_options = fields[sep + 1 :]
        mounts.append(
            Mount(
                mount_id=_uint(fields[0], "mountinfo mount id"),
                parent_id=_uint(fields[1], "mountinfo parent id"),
                major_minor=fields[2],
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                options=tuple(fields[5].split(",")),
                optional_fields=tuple(fields[6:sep]),
                fstype=fstype,
                source=_unescape(source),
                super_options=tuple(super_options.split(",")),
            )
        )
    return mounts


# --- /proc/PID/stat ------------------------------------------------------------------------------


def parse_stat_starttime(text: str) -> int:
    """Field 22 of ``/proc/PID/stat``: starttime, the clock ticks after boot at which the
    process started (proc(5)); with the pid it names one process, a reused pid starts later.
    The comm (field 2) is in parentheses and may hold spaces and ')': the fields are counted
    after its LAST ')'."""
    _, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        raise ValueError(f"stat: expected 'PID (COMM) STATE ...' with 52 fields, got {text[:80]!r}")
    return _uint(fields[19], "stat starttime")


# --- meminfo -------------------------------------------------------------------------------------


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` in BYTES (``kB`` means KiB); unitless keys (HugePages_*) kept as is."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not key or not 1 <= len(fields) <= 2:
            raise ValueError(f"meminfo: expected 'Key: value [kB]', got {line!r}")
        value = _uint(fields[0], f"meminfo {key}")
        if len(fields) == 2:
            if fields[1] != "kB":
                raise ValueError(f"meminfo: unknown unit {fields[1]!r} for {key}")
            value *= 1024
        out[key] = value
    return out


def cpuinfo_machine(cpuinfo: str, default: str) -> str:
    """The machine a /proc/cpuinfo text comes from (pure): arm64 kernels print "Features" and
    "CPU architecture", x86 ones "flags" and "vendor_id"; else ``default`` (a --root tree's CPU)."""
    keys = {line.partition(":")[0].strip() for line in cpuinfo.splitlines()}
    if "Features" in keys and "CPU architecture" in keys:
        return "aarch64"
    if "flags" in keys and "vendor_id" in keys:
        return "x86_64"
    return default
