"""[clocks] resolved on this board: which cpufreq policies and devfreq devices each key means,
and the files written, every value checked against what the board offers. Pure: the facts come
from ``HostFacts.clocks`` (governor/kernel/clocks.py discovered them).

- ``big`` / ``little``: the cpufreq policies whose CPUs are the cluster ``cpu.cpus = "big"``
  means (cpu_capacity of their CPUs, else cpuinfo_max_freq: the lowest is LITTLE).
- ``npu`` / ``gpu`` / ``dmc``: the devfreq device whose name or device-tree compatible string
  says so (``fdab0000.npu``, ``rockchip,rk3588-mali``, ``dmc``): never a hard-coded address.

Any key the board cannot honour (no such device, governor or frequency) is a PolicyError (65)
naming ``clocks.<key>``.
"""

from __future__ import annotations

from governor.errors import PolicyError
from governor.kernel.clocks import FREQ_UNIT, ROLE_FILES, ClockDevice
from governor.kernel.parse import format_cpulist
from governor.plan.host import HostFacts
from governor.plan.model import ClockTarget, ClockWrite
from governor.policy.clocks import ClockSetting, ClocksSection, Freq

# devfreq device -> key: by its name's suffix (the DT node "npu@fdab0000" makes "fdab0000.npu")
# or by a word in a compatible string ("rockchip,rk3588-rknpu", "arm,mali-bifrost")
_DEVFREQ_MATCH: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "npu": ((".npu",), ("npu",)),
    "gpu": ((".gpu",), ("mali", "gpu")),
    "dmc": (("dmc", ".dmc"), ("dmc",)),
}


def _refuse(message: str, key: str, source: str | None, hint: str | None = None) -> PolicyError:
    """65 naming the field: ``key`` is "big" or "big.min"."""
    return PolicyError(message, file=source, field=f"clocks.{key}", hint=hint)


def devfreq_matches(key: str, device: ClockDevice) -> bool:
    names, words = _DEVFREQ_MATCH[key]
    if device.kind != "devfreq":
        return False
    if device.name in names or any(device.name.endswith(n) for n in names if n[0] == "."):
        return True
    return any(w in c.split(",", 1)[-1] for c in device.compatible for w in words)


def devices_for(key: str, host: HostFacts, source: str | None) -> tuple[ClockDevice, ...]:
    """The board's devices behind one key (PolicyError when there is none)."""
    if key in ("big", "little"):
        # as `cpu.cpus = "big"`: the lowest capacity is LITTLE, every class above it big
        policies = [d for d in host.clocks if d.kind == "cpufreq"]
        if not policies:
            raise _refuse(
                "this board has no cpufreq policies (sysfs devices/system/cpu/cpufreq is empty)",
                key,
                source,
                hint="the kernel has no cpufreq driver here; remove the key",
            )
        lowest = min(d.capacity for d in policies)
        if all(d.capacity == lowest for d in policies):
            raise _refuse(
                f"this board has no distinct core types: its cpufreq policies"
                f" ({', '.join(d.name for d in policies)}) report the same capacity",
                key,
                source,
            )
        little = key == "little"
        return tuple(d for d in policies if (d.capacity == lowest) == little)
    found = tuple(d for d in host.clocks if devfreq_matches(key, d))
    if not found:
        have = ", ".join(d.name for d in host.clocks if d.kind == "devfreq") or "none"
        raise _refuse(
            f"this board has no {key} devfreq device; sysfs class/devfreq has: {have}",
            key,
            source,
            hint=(
                "a missing dmc means firmware without DMC devfreq (RK3588: trusted firmware"
                " unsupported); remove the key"
                if key == "dmc"
                else f"no {key} driver with devfreq is loaded here; remove the key"
            ),
        )
    if len(found) > 1:
        raise _refuse(
            f"{len(found)} devfreq devices match {key} ({', '.join(d.name for d in found)})",
            key,
            source,
        )
    return found


def _frequency(freq: Freq, device: ClockDevice, key: str, role: str, source: str | None) -> int:
    avail = device.frequencies
    if not avail:
        raise _refuse(f"{device.name} lists no available frequencies", f"{key}.{role}", source)
    if freq.kind == "max":
        return avail[-1]
    if freq.kind == "min":
        return avail[0]
    unit = FREQ_UNIT[device.kind]
    value = freq.value if freq.kind == "raw" else freq.value // unit
    if (freq.kind == "hz" and freq.value % unit) or value not in avail:
        spelled = "kHz" if unit == 1000 else "Hz"
        raise _refuse(
            f"{freq} is not an available frequency of {device.kind} {device.name}"
            f" ({spelled}: {' '.join(map(str, avail))})",
            f"{key}.{role}",
            source,
            hint='use "max", "min" or a value of that list',
        )
    return value


def _writes(
    setting: ClockSetting, device: ClockDevice, key: str, source: str | None
) -> tuple[ClockWrite, ...]:
    files = ROLE_FILES[device.kind]
    for role in ("governor", "min", "max", "freq"):
        if getattr(setting, role) is None or device.files is None:
            continue
        if role == "freq":
            continue  # setspeed/set_freq appears once the userspace governor (required) runs
        if files[role] not in device.files:
            raise _refuse(
                f"{device.kind} {device.name} has no {files[role]} file ({device.path})",
                f"{key}.{role}",
                source,
                hint=f"this board's driver does not offer it: drop clocks.{key}.{role}",
            )
    out: list[ClockWrite] = []
    if setting.governor is not None:
        if setting.governor not in device.governors:
            raise _refuse(
                f"governor {setting.governor!r} is not available on"
                f" {device.kind} {device.name} (available: {' '.join(device.governors)})",
                f"{key}.governor",
                source,
            )
        out.append(ClockWrite(files["governor"], setting.governor, f"clocks.{key}.governor"))
    bounds = {}
    for role in ("min", "max", "freq"):
        freq: Freq | None = getattr(setting, role)
        if freq is not None:
            bounds[role] = _frequency(freq, device, key, role, source)
    if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
        raise _refuse(
            f"min {bounds['min']} is above max {bounds['max']} on {device.name}",
            key,
            source,
        )
    for role, value in bounds.items():
        out.append(ClockWrite(files[role], str(value), f"clocks.{key}.{role}"))
    return tuple(out)


def resolve(
    clocks: ClocksSection, host: HostFacts, source: str | None, notes: list[str]
) -> tuple[ClockTarget, ...]:
    """Every [clocks] key as the writes on this board's devices, in key order."""
    out: list[ClockTarget] = []
    for key, setting in clocks.items():
        devices = devices_for(key, host, source)
        for device in devices:
            out.append(
                ClockTarget(
                    key=key,
                    kind=device.kind,
                    name=device.name,
                    path=device.path,
                    writes=_writes(setting, device, key, source),
                )
            )
        where = ", ".join(
            f"{d.name} (cpus {format_cpulist(d.cpus)})" if d.cpus else d.name for d in devices
        )
        notes.append(f"clocks.{key} -> {devices[0].kind} {where}")
    return tuple(out)
