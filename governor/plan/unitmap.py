"""Plan -> systemd, the part shared by unit files and D-Bus: unit names and ONE mapping table
(policy field -> directive -> cgroup file) with the systemd version each directive needs. Pure:
no files, no environment, no clock. deploy/dropin.py renders the table's settings into unit
files; the transient backend (backends/systemd.py) sends them over D-Bus.

Layout under systemd (documented in docs/server.md, "Deploy with systemd"):

    <policy.slice>                          e.g. governor.slice (shipped: units/governor.slice)
      <stem>-<escaped name>.slice           the policy's limits: [Slice] directives
        governor@<name>.service             Delegate=yes; `governor launch --backend systemd`
          supervisor/                       the governor itself (no internal processes)
          engine/                           the engine; what systemd cannot express lands here

A dash in a slice name means nesting (``a-b.slice`` lives in ``a.slice``), so the policy name is
escaped with systemd-escape semantics: ``npu-chat`` -> ``governor-npu\\x2dchat.slice`` whose
cgroup is ``governor.slice/governor-npu\\x2dchat.slice`` (systemd.slice(5)). A transient launch
(``--backend systemd`` outside the service) uses a scope ``governor-<escaped>.scope`` in
``<policy.slice>`` that carries the same limits itself, with the same two leaves inside.

Everything systemd cannot express (or this systemd version cannot) is applied by
``governor launch`` on the engine leaf at start (:func:`split` says which and why).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal

from governor.kernel import files as kf
from governor.kernel.parse import parse_cpulist
from governor.plan.model import CgroupWrite, Plan
from governor.record import record

# --- feature gates (systemd NEWS; systemd.resource-control(5), systemd.service(5)) -----------
TASKS_MAX_MIN_SYSTEMD = 227  # TasksMax=
IO_WEIGHT_MIN_SYSTEMD = 230  # IOWeight= (unified io controller)
MEMORY_MAX_MIN_SYSTEMD = 231  # MemoryHigh=, MemoryMax= (unified memory controller)
MEMORY_LOW_MIN_SYSTEMD = 232  # MemoryLow=, MemorySwapMax=, CPUWeight=
MEMORY_MIN_MIN_SYSTEMD = 240  # MemoryMin=
CPU_QUOTA_MIN_SYSTEMD = 213  # CPUQuota=
CPU_QUOTA_PERIOD_MIN_SYSTEMD = 242  # CPUQuotaPeriodSec= (before it the period was fixed 100ms)
ALLOWED_CPUS_MIN_SYSTEMD = 244  # AllowedCPUs=, AllowedMemoryNodes= (cpuset controller)
OOM_POLICY_MIN_SYSTEMD = 243  # OOMPolicy= for services
OOM_POLICY_SCOPE_MIN_SYSTEMD = 253  # OOMPolicy= for scopes (252 rejects it on a transient scope)
DELEGATE_SUBGROUP_MIN_SYSTEMD = 254  # DelegateSubgroup= would move the main process for us

# systemd's cpu.max period when CPUQuotaPeriodSec= is unset (cgroup.c: CGROUP_CPU_QUOTA_DEFAULT_PERIOD_USEC)
DEFAULT_CPU_PERIOD_US = 100_000
UINT64_MAX = (1 << 64) - 1  # "infinity" on the bus (CGROUP_LIMIT_MAX)

SUPERVISOR_LEAF = "supervisor"
ENGINE_LEAF = "engine"

DbusValue = int | str | bool | bytes | list[int] | list[str]
DbusProp = tuple[str, DbusValue]


# --- names -------------------------------------------------------------------------------------

_ESCAPE_KEEP = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.")


def escape(text: str) -> str:
    """``systemd-escape TEXT``: '/' -> '-', '-' and other bytes -> ``\\xNN`` (unit_name_escape)."""
    out = []
    for i, ch in enumerate(text):
        if ch == "/":
            out.append("-")
        elif ch in _ESCAPE_KEEP and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out)


def slice_cgroup(slice_unit: str) -> str:
    """The cgroup path of a slice unit: ``a-b.slice`` -> ``a.slice/a-b.slice`` (``-.slice`` -> "")."""
    if not slice_unit.endswith(".slice"):
        raise ValueError(f"not a slice unit: {slice_unit!r}")
    stem = slice_unit.removesuffix(".slice")
    if stem in ("", "-"):
        return ""
    parts = stem.split("-")
    if any(p == "" for p in parts):
        raise ValueError(f"invalid slice name (empty component between dashes): {slice_unit!r}")
    return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def _stem(slice_unit: str) -> str:
    stem = slice_unit.removesuffix(".slice")
    return "" if stem == "-" else stem


def policy_slice(slice_unit: str, policy: str) -> str:
    """The policy's own slice below ``slice_unit``: governor.slice + npu-chat ->
    ``governor-npu\\x2dchat.slice``."""
    stem = _stem(slice_unit)
    return f"{stem}-{escape(policy)}.slice" if stem else f"{escape(policy)}.slice"


def service_unit(policy: str) -> str:
    """The template instance; policy names ([a-z0-9_-]) need no escaping there, %i is the name."""
    return f"governor@{policy}.service"


def scope_unit(policy: str) -> str:
    return f"governor-{escape(policy)}.scope"


def service_cgroup(plan: Plan) -> str:
    ps = policy_slice(plan.slice, plan.policy)
    return f"{slice_cgroup(ps)}/{service_unit(plan.policy)}"


def scope_cgroup(plan: Plan) -> str:
    base = slice_cgroup(plan.slice)
    unit = scope_unit(plan.policy)
    return f"{base}/{unit}" if base else unit


# --- the mapping table -------------------------------------------------------------------------


def _bytes_ini(value: str) -> str:
    return "infinity" if value == "max" else value


def _bytes_bus(value: str) -> int:
    return UINT64_MAX if value == "max" else int(value)


def _io_weight(value: str) -> str:
    # the compiler writes the default line "default N" (io.weight takes one line per write)
    return value.removeprefix("default").strip()


def _cpu_max(value: str) -> tuple[int | None, int]:
    quota, _, period = value.partition(" ")
    return (None if quota == "max" else int(quota)), int(period or DEFAULT_CPU_PERIOD_US)


def _cpu_max_ini(value: str) -> str:
    quota, period = _cpu_max(value)
    if quota is None:
        return "infinity"
    percent = (Decimal(quota) * 100 / Decimal(period)).normalize()
    return f"{percent:f}%"


def _cpu_max_bus(value: str) -> list[DbusProp]:
    quota, period = _cpu_max(value)
    per_sec = UINT64_MAX if quota is None else quota * 1_000_000 // period
    props: list[DbusProp] = [("CPUQuotaPerSecUSec", per_sec)]
    if period != DEFAULT_CPU_PERIOD_US:
        props.append(("CPUQuotaPeriodUSec", period))
    return props


def cpu_mask(cpus: Sequence[int]) -> bytes:
    """AllowedCPUs "ay": a little-endian bitmask, CPU n is bit n%8 of byte n//8 (cpu-set-util.c)."""
    if not cpus:
        return b""
    mask = bytearray(max(cpus) // 8 + 1)
    for cpu in cpus:
        mask[cpu // 8] |= 1 << (cpu % 8)
    return bytes(mask)


@record(frozen=True)
class Mapping:
    """One row: a cgroup file the compiler writes, the directive that makes systemd write it."""

    field: str  # policy field path (CgroupWrite.reason)
    cgroup_file: str
    directive: str | None  # None: systemd cannot express it on the unit; governor applies it
    min_systemd: int = 0
    ini: Callable[[str], str] = str
    bus: Callable[[str], list[DbusProp]] | None = None
    why_not: str = ""  # when directive is None: why, and where governor applies it instead


def _bus(name: str, conv: Callable[[str], DbusValue]) -> Callable[[str], list[DbusProp]]:
    return lambda value: [(name, conv(value))]


LIMITS: tuple[Mapping, ...] = (
    Mapping("pids.max", kf.PIDS_MAX, "TasksMax", TASKS_MAX_MIN_SYSTEMD, _bytes_ini,
            _bus("TasksMax", _bytes_bus)),
    Mapping("memory.oom_group", kf.MEMORY_OOM_GROUP, None,
            why_not="systemd sets memory.oom.group only from OOMPolicy=kill on the whole unit,"
            " whose cgroup also holds the supervising governor; governor writes it on the"
            " engine leaf"),
    Mapping("memory.swap_max", kf.MEMORY_SWAP_MAX, "MemorySwapMax", MEMORY_LOW_MIN_SYSTEMD,
            _bytes_ini, _bus("MemorySwapMax", _bytes_bus)),
    Mapping("memory.min", kf.MEMORY_MIN, "MemoryMin", MEMORY_MIN_MIN_SYSTEMD, _bytes_ini,
            _bus("MemoryMin", _bytes_bus)),
    Mapping("memory.low", kf.MEMORY_LOW, "MemoryLow", MEMORY_LOW_MIN_SYSTEMD, _bytes_ini,
            _bus("MemoryLow", _bytes_bus)),
    Mapping("memory.high", kf.MEMORY_HIGH, "MemoryHigh", MEMORY_MAX_MIN_SYSTEMD, _bytes_ini,
            _bus("MemoryHigh", _bytes_bus)),
    Mapping("memory.max", kf.MEMORY_MAX, "MemoryMax", MEMORY_MAX_MIN_SYSTEMD, _bytes_ini,
            _bus("MemoryMax", _bytes_bus)),
    Mapping("io.weight", kf.IO_WEIGHT, "IOWeight", IO_WEIGHT_MIN_SYSTEMD, _io_weight,
            _bus("IOWeight", lambda v: int(_io_weight(v)))),
    Mapping("cpu.weight", kf.CPU_WEIGHT, "CPUWeight", MEMORY_LOW_MIN_SYSTEMD, str,
            _bus("CPUWeight", int)),
    Mapping("cpu.max", kf.CPU_MAX, "CPUQuota", CPU_QUOTA_MIN_SYSTEMD, _cpu_max_ini,
            _cpu_max_bus),
    Mapping("cpu.cpus", kf.CPUSET_CPUS, "AllowedCPUs", ALLOWED_CPUS_MIN_SYSTEMD, str,
            _bus("AllowedCPUs", lambda v: cpu_mask(parse_cpulist(v)))),
    Mapping("cpu.mems", kf.CPUSET_MEMS, "AllowedMemoryNodes", ALLOWED_CPUS_MIN_SYSTEMD, str,
            _bus("AllowedMemoryNodes", lambda v: cpu_mask(parse_cpulist(v)))),
)  # fmt: skip
_BY_FILE = {m.cgroup_file: m for m in LIMITS}


def mapping_for(cgroup_file: str) -> Mapping | None:
    """The row of the table for a cgroup file (None: systemd has no directive for it)."""
    return _BY_FILE.get(cgroup_file)


def _gate_note(m: Mapping, version: int) -> str:
    return f"{m.directive}= needs systemd >= {m.min_systemd} (this host: {version})"


@record(frozen=True)
class UnitSetting:
    mapping: Mapping
    write: CgroupWrite
    ini: str  # the directive's value in a unit file

    @property
    def directive(self) -> str:
        assert self.mapping.directive is not None
        return self.mapping.directive

    def bus(self) -> list[DbusProp]:
        assert self.mapping.bus is not None
        return self.mapping.bus(self.write.value)


@record(frozen=True)
class Deferred:
    """A write systemd does not make; ``governor launch`` applies it on the engine leaf."""

    write: CgroupWrite
    why: str


@record(frozen=True)
class Split:
    unit: tuple[UnitSetting, ...]
    governor: tuple[Deferred, ...]


def split(plan: Plan, systemd_version: int) -> Split:
    """Which of the plan's writes systemd makes (as unit settings) and which governor makes."""
    unit: list[UnitSetting] = []
    deferred: list[Deferred] = []
    for w in plan.writes:
        m = _BY_FILE.get(w.file)
        if m is None:
            deferred.append(Deferred(w, "no systemd directive for this file"))
        elif m.directive is None:
            deferred.append(Deferred(w, m.why_not))
        elif systemd_version < m.min_systemd:
            deferred.append(Deferred(w, _gate_note(m, systemd_version)))
        elif w.file == kf.CPU_MAX and not _quota_expressible(w.value, systemd_version):
            deferred.append(Deferred(w, "CPUQuota= cannot express this quota exactly"))
        else:
            unit.append(UnitSetting(m, w, m.ini(w.value)))
    return Split(tuple(unit), tuple(deferred))


def _quota_expressible(value: str, version: int) -> bool:
    quota, period = _cpu_max(value)
    if period != DEFAULT_CPU_PERIOD_US and version < CPU_QUOTA_PERIOD_MIN_SYSTEMD:
        return False
    # CPUQuota= takes a percentage with two decimals (parse_permyriad_unbounded)
    return quota is None or (quota * 10_000) % period == 0
