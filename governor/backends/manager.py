"""Live limits under systemd go through the manager: `governor tune`, `rollback` and the
``--confirm`` reverter set slice-level knobs as *runtime* unit properties (D-Bus
``SetUnitProperties(name, runtime=true, ...)`` through pystemd when it is installed, else
``systemctl set-property --runtime``), so ``systemctl show`` stays true and the manager never
"restores" its own idea of the value over a file written behind its back. `governor status`
reads the unit's values back (:func:`unit_values`) for its third column.

Which unit carries the limits follows from the unit's cgroup U (deploy/dropin.py): the
installed ``governor@<name>.service`` runs inside the policy's slice, which carries them
(``<...>/governor-<name>.slice/governor@<name>.service`` -> the slice); a transient scope
carries them itself. Standard library only (the reverter runs it); pystemd is imported lazily.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from typing import Any

from governor.backends.cgroupfs import _same as cgroupfs_same
from governor.errors import HostError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.plan.model import Plan
from governor.plan.unitmap import (
    DEFAULT_CPU_PERIOD_US,
    UINT64_MAX,
    Mapping,
    _quota_expressible,
    mapping_for,
    split,
)

SETTLE_S = 10.0  # the manager realizes a property on the cgroup after it answers the call
SETTLE_POLL_S = 0.02


def limits_unit(unit_cgroup: str) -> tuple[str, str]:
    """(unit, cgroup) that carries the policy's limits, from the engine's unit cgroup U."""
    parent, _, unit = unit_cgroup.rpartition("/")
    if unit.endswith(".service") and parent:
        return parent.rpartition("/")[2], parent
    return unit, unit_cgroup


def describe(full_plan: Plan, unit_cgroup: str, systemd_version: int) -> dict[str, Any]:
    """What the published state says about the manager's side (status reads it): the unit that
    carries the limits, its cgroup, and the policy's value of each setting it carries."""
    unit, cgroup = limits_unit(unit_cgroup)
    limits = [
        {"file": s.write.file, "reason": s.write.reason, "policy": s.write.value}
        for s in split(full_plan, systemd_version).unit
    ]
    return {"unit": unit, "cgroup": cgroup, "version": systemd_version, "limits": limits}


def managed(file: str, value: str, systemd_version: int) -> Mapping | None:
    """The directive that expresses ``file = value`` on this systemd (None: governor writes the
    file itself, on the engine leaf, as at launch: unitmap.split's rules)."""
    m = mapping_for(file)
    if m is None or m.directive is None or m.bus is None or systemd_version < m.min_systemd:
        return None
    if file == kf.CPU_MAX and not _quota_expressible(value, systemd_version):
        return None
    return m


def _set_over_dbus(unit: str, props: list[tuple[str, Any]]) -> None:
    from governor.backends.systemd import (
        MANAGER_IFACE,
        SYSTEMD_DEST,
        SYSTEMD_PATH,
        _bus_error,
        _import_pystemd,
        signed,
    )

    dbuslib = _import_pystemd()  # HostError when pystemd is missing
    args: list[Any] = dbuslib.apply_signature(b"sb", [unit.encode(), True])
    args += [(ord("a"), b"(sv)")]
    for name, sig, value in signed(props):
        v = value.encode() if isinstance(value, str) else value
        args += [(ord("r"), b"sv"), (ord("s"), name.encode()), (ord("v"), sig.encode())]
        args += dbuslib.apply_signature(sig.encode(), [v])
        args += [(-1, None), (-1, None)]
    args += [(-1, None)]
    try:
        with dbuslib.DBus() as bus:
            bus.call_method(SYSTEMD_DEST, SYSTEMD_PATH, MANAGER_IFACE, b"SetUnitProperties", args)
    except Exception as err:  # pystemd raises DBusError subclasses built at runtime
        raise _bus_error(err, f"cannot set {unit} properties") from err


def _set_with_systemctl(unit: str, m: Mapping, value: str) -> None:
    from governor.backends.systemd import set_runtime_property

    set_runtime_property(
        unit,
        f"{m.directive}={m.ini(value)}",
        hint=f"is the manager running? `systemctl show {unit}` says what it holds",
    )


class ManagerWriter:
    """``write(file, value)`` for tune.apply/rollback: through the manager (runtime), then wait
    until the kernel file shows it (staged lowering reclaims only after memory.high holds).
    memory.reclaim is no setting: it is written to the cgroup directly."""

    def __init__(
        self,
        fs: CgroupFs,
        unit: str,
        cgroup: str,
        systemd_version: int,
        *,
        set_props: Callable[[str, Mapping, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fs, self.unit, self.cgroup, self.version = fs, unit, cgroup, systemd_version
        self._set = set_props or set_property
        self._clock, self._sleep = clock, sleep
        self.via = "systemd"

    def __call__(self, file: str, value: str) -> None:
        if file == kf.MEMORY_RECLAIM:
            self.fs.write(self.cgroup, file, value)
            return
        m = managed(file, value, self.version)
        if m is None:
            raise HostError(
                f"systemd {self.version} cannot express {file} = {value} ({self.unit})",
                hint="governor writes it on the engine leaf at launch; change the policy",
            )
        self._set(self.unit, m, value)
        deadline = self._clock() + SETTLE_S
        while not _same(file, self.fs.read(self.cgroup, file).strip(), value):
            if self._clock() >= deadline:
                break  # read back by the caller: the journal records what the kernel holds
            self._sleep(SETTLE_POLL_S)


def set_property(unit: str, m: Mapping, value: str) -> None:
    """One runtime property: D-Bus when pystemd is there, else systemctl."""
    assert m.bus is not None
    try:
        _set_over_dbus(unit, m.bus(value))
    except HostError:  # no pystemd
        _set_with_systemctl(unit, m, value)


def _same(file: str, live: str, want: str) -> bool:
    if cgroupfs_same(file, live, want):  # cpu lists as sets, io.weight's default line
        return True
    live, want = live.strip(), want.strip()
    if live.isdigit() and want.isdigit():  # memory files read back page-aligned
        return int(live) == int(want) // 4096 * 4096
    return False


# --- reading the unit's values back (status) ---------------------------------------------------

_SPAN = re.compile(r"(\d+(?:\.\d+)?)(us|ms|min|s|h)")
_SPAN_US = {"us": 1, "ms": 1_000, "s": 1_000_000, "min": 60_000_000, "h": 3_600_000_000}


def _timespan_us(text: str) -> int | None:
    """systemctl's timespans (``1.500000s``, ``500ms``, ``1min 30s``) in microseconds."""
    if text in ("infinity", ""):
        return None
    parts = _SPAN.findall(text)
    if not parts:
        raise ValueError(text)
    return round(sum(float(n) * _SPAN_US[u] for n, u in parts))


def _limit(text: str) -> str | None:
    if text in ("", "[not set]"):
        return None
    return "max" if text == "infinity" or text == str(UINT64_MAX) else text


def kernel_spelling(props: dict[str, str]) -> dict[str, str | None]:
    """``systemctl show`` values -> what the kernel file would say (None: not set)."""
    out: dict[str, str | None] = {}
    for file, prop in (
        (kf.MEMORY_MIN, "MemoryMin"),
        (kf.MEMORY_LOW, "MemoryLow"),
        (kf.MEMORY_HIGH, "MemoryHigh"),
        (kf.MEMORY_MAX, "MemoryMax"),
        (kf.MEMORY_SWAP_MAX, "MemorySwapMax"),
        (kf.PIDS_MAX, "TasksMax"),
        (kf.CPU_WEIGHT, "CPUWeight"),
    ):
        if prop in props:
            out[file] = _limit(props[prop])
    if "IOWeight" in props:
        weight = _limit(props["IOWeight"])
        out[kf.IO_WEIGHT] = None if weight is None else f"default {weight}"
    if "AllowedCPUs" in props:
        out[kf.CPUSET_CPUS] = props["AllowedCPUs"] or None
    if "CPUQuotaPerSecUSec" in props:
        try:
            per_sec = _timespan_us(props["CPUQuotaPerSecUSec"])
            period = _timespan_us(props.get("CPUQuotaPeriodUSec", "")) or DEFAULT_CPU_PERIOD_US
        except ValueError:
            per_sec, period = None, DEFAULT_CPU_PERIOD_US
        quota = "max" if per_sec is None else str(per_sec * period // 1_000_000)
        out[kf.CPU_MAX] = f"{quota} {period}"
    return out


SHOWN = (
    "MemoryMin", "MemoryLow", "MemoryHigh", "MemoryMax", "MemorySwapMax", "TasksMax",
    "CPUWeight", "IOWeight", "AllowedCPUs", "CPUQuotaPerSecUSec", "CPUQuotaPeriodUSec",
)  # fmt: skip


def unit_values(unit: str) -> dict[str, str | None]:
    """file -> the unit's value in the kernel's spelling (``systemctl show``); {} when the
    manager cannot be asked."""
    try:
        res = subprocess.run(
            ["systemctl", "show", unit, *(f"--property={p}" for p in SHOWN)],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    props = dict(line.partition("=")[::2] for line in res.stdout.splitlines() if "=" in line)
    return kernel_spelling(props)


def same(file: str, live: str | None, want: str | None) -> bool:
    """Kernel and unit values agree (page rounding and io.weight's "default" spelling aside)."""
    if live is None or want is None:
        return live == want
    return _same(file, live, want)
