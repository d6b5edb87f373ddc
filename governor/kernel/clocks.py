"""The one door to the board's clock files: cpufreq policies and devfreq devices under an
injected sysfs root (``/sys`` in production, a fixture tree in tests).

Kernel names are spelled here once (Documentation/admin-guide/pm/cpufreq.rst,
Documentation/ABI/testing/sysfs-class-devfreq). cpufreq frequencies are kHz, devfreq's Hz:
values pass through as the kernel spells them. Files are written like cgroupfs files
(``O_WRONLY | O_TRUNC``, never ``O_CREAT``: a missing file is an error, not a new file) and
every ``OSError`` becomes a :class:`~governor.errors.BackendError` or
:class:`~governor.errors.PermissionDenied` with the file, the value and the errno.

Facts (:func:`discover`) are the static ones only: which devices, their CPUs, names,
compatible strings, governors and frequencies. Current values are read when they are needed.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Literal

from governor.errors import BackendError, PermissionDenied
from governor.record import record

ClockKind = Literal["cpufreq", "devfreq"]

# relative to the sysfs root
CPUFREQ_DIR = "devices/system/cpu/cpufreq"  # policyN, one per cluster sharing a clock
DEVFREQ_DIR = "class/devfreq"  # one symlink per device (dmc, fb000000.gpu, fdab0000.npu)

CPU_DIR = "devices/system/cpu"
CPU_CAPACITY = "cpu_capacity"  # cpuN/, arm64 topology
CPUINFO_MAX_FREQ = "cpuinfo_max_freq"

# cpufreq policy files (kHz)
RELATED_CPUS = "related_cpus"
SCALING_GOVERNOR = "scaling_governor"
SCALING_AVAILABLE_GOVERNORS = "scaling_available_governors"
SCALING_AVAILABLE_FREQUENCIES = "scaling_available_frequencies"
SCALING_MIN_FREQ = "scaling_min_freq"
SCALING_MAX_FREQ = "scaling_max_freq"
SCALING_SETSPEED = "scaling_setspeed"  # userspace governor only; "<unsupported>" otherwise

# devfreq device files (Hz)
DEVFREQ_NAME = "name"
DEVFREQ_GOVERNOR = "governor"
DEVFREQ_AVAILABLE_GOVERNORS = "available_governors"
DEVFREQ_AVAILABLE_FREQUENCIES = "available_frequencies"
DEVFREQ_MIN_FREQ = "min_freq"
DEVFREQ_MAX_FREQ = "max_freq"
DEVFREQ_SET_FREQ = "userspace/set_freq"  # exists while the userspace governor runs
DEVFREQ_COMPATIBLE = "device/of_node/compatible"  # NUL-separated device-tree strings

# what a policy asks for -> the file of each kind, in one table (compiler, applier, status)
ROLE_FILES: dict[ClockKind, dict[str, str]] = {
    "cpufreq": {
        "governor": SCALING_GOVERNOR,
        "min": SCALING_MIN_FREQ,
        "max": SCALING_MAX_FREQ,
        "freq": SCALING_SETSPEED,
    },
    "devfreq": {
        "governor": DEVFREQ_GOVERNOR,
        "min": DEVFREQ_MIN_FREQ,
        "max": DEVFREQ_MAX_FREQ,
        "freq": DEVFREQ_SET_FREQ,
    },
}
FREQ_UNIT: dict[ClockKind, int] = {"cpufreq": 1000, "devfreq": 1}  # Hz per unit of the files

_WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC


@record(frozen=True)
class ClockDevice:
    """One clock the board lets user space set: a cpufreq policy or a devfreq device."""

    kind: ClockKind
    name: str  # "policy4", "fdab0000.npu"
    path: str  # its directory, absolute
    cpus: tuple[int, ...] = ()  # cpufreq: related_cpus
    compatible: tuple[str, ...] = ()  # devfreq: the parent's device-tree compatible strings
    governors: tuple[str, ...] = ()
    frequencies: tuple[int, ...] = ()  # ascending, in the files' unit
    # cpufreq: the cluster's rank, as `cpu.cpus = "big"` ranks CPUs (governor/plan/host.py):
    # cpu_capacity of its CPUs when every CPU has one, else cpuinfo_max_freq
    capacity: int = 0
    # the role files it has (ROLE_FILES' values present in its directory); None: not probed
    # (facts from before this field)
    files: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClockDevice:
        return cls(
            kind=d["kind"],
            name=d["name"],
            path=d["path"],
            cpus=tuple(d.get("cpus", ())),
            compatible=tuple(d.get("compatible", ())),
            governors=tuple(d.get("governors", ())),
            frequencies=tuple(d.get("frequencies", ())),
            capacity=d.get("capacity", 0),
            files=None if d.get("files") is None else tuple(d["files"]),
        )


# ------------------------------------------------------------------ pure parsers


def parse_words(text: str) -> tuple[str, ...]:
    """A space-separated list (available governors, related_cpus)."""
    return tuple(text.split())


def parse_frequencies(text: str) -> tuple[int, ...]:
    """An available-frequency list, ascending and without duplicates; ValueError otherwise."""
    try:
        return tuple(sorted({int(w) for w in text.split()}))
    except ValueError as err:
        raise ValueError(f"not a frequency list: {text.strip()[:80]!r}") from err


def parse_compatible(raw: bytes) -> tuple[str, ...]:
    """A device-tree ``compatible`` property: NUL-separated strings."""
    return tuple(s for s in raw.decode("ascii", "replace").split("\0") if s)


# ------------------------------------------------------------------ reading and writing


def read(path: str) -> str:
    """One clock file's value, stripped; BackendError (with the file) when it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError as err:
        raise _translate(err, "cannot read clock file", path) from err


def write(path: str, value: str) -> None:
    """One write(2) of ``value`` to an existing clock file."""
    try:
        fd = os.open(path, _WRITE_FLAGS)
    except OSError as err:
        raise _translate(err, "cannot open clock file", path, value) from err
    try:
        os.write(fd, value.encode("ascii"))
    except OSError as err:
        raise _translate(err, "cannot write clock file", path, value) from err
    finally:
        os.close(fd)


def _translate(
    err: OSError, action: str, path: str, value: str | None = None
) -> BackendError | PermissionDenied:
    code = err.errno
    if code in (errno.EACCES, errno.EPERM):
        return PermissionDenied(
            action, file=path, value=value, errno=code, hint="clock files are root's: run as root"
        )
    hint = None
    if code == errno.EINVAL:
        hint = (
            "the kernel refused the value (min above max, or not an available governor/frequency)"
        )
    return BackendError(action, file=path, value=value, errno=code, hint=hint)


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def _cpufreq(directory: Path) -> ClockDevice | None:
    related = _text(directory / RELATED_CPUS)
    if related is None:
        return None
    try:
        cpus = tuple(sorted(int(c) for c in related.split()))
        freqs = parse_frequencies(_text(directory / SCALING_AVAILABLE_FREQUENCIES) or "")
    except ValueError:
        return None
    return ClockDevice(
        kind="cpufreq",
        name=directory.name,
        path=os.path.abspath(directory),
        cpus=cpus,
        governors=parse_words(_text(directory / SCALING_AVAILABLE_GOVERNORS) or ""),
        frequencies=freqs,
        files=_role_files("cpufreq", directory),
    )


def _devfreq(link: Path) -> ClockDevice | None:
    directory = link.resolve() if link.is_symlink() else link
    if not (directory / DEVFREQ_GOVERNOR).exists():
        return None
    try:
        compatible = parse_compatible((directory / DEVFREQ_COMPATIBLE).read_bytes())
    except OSError:
        compatible = ()
    try:
        freqs = parse_frequencies(_text(directory / DEVFREQ_AVAILABLE_FREQUENCIES) or "")
    except ValueError:
        return None
    return ClockDevice(
        kind="devfreq",
        name=_text(directory / DEVFREQ_NAME) or link.name,
        path=str(directory),
        compatible=compatible,
        governors=parse_words(_text(directory / DEVFREQ_AVAILABLE_GOVERNORS) or ""),
        frequencies=freqs,
        files=_role_files("devfreq", directory),
    )


def _role_files(kind: ClockKind, directory: Path) -> tuple[str, ...]:
    """The role files ``directory`` has (a driver may lack one: no min_freq, no governor)."""
    return tuple(f for f in ROLE_FILES[kind].values() if (directory / f).exists())


def _ranked(sysfs: Path, policies: list[ClockDevice]) -> list[ClockDevice]:
    """Each policy with its cluster's capacity: the CPUs' cpu_capacity when all have one (the
    scheduler's view), else the policy's cpuinfo_max_freq (as HostFacts.core_types does)."""
    caps: dict[str, int] = {}
    for p in policies:
        values = [_text(sysfs / CPU_DIR / f"cpu{c}" / CPU_CAPACITY) for c in p.cpus]
        if not all(v is not None and v.isdigit() for v in values):
            caps = {}
            break
        caps[p.path] = max(int(v) for v in values if v is not None)
    out = []
    for p in policies:
        rank = caps.get(p.path)
        if rank is None:
            text = _text(Path(p.path) / CPUINFO_MAX_FREQ) or ""
            rank = int(text) if text.isdigit() else 0
        out.append(ClockDevice(**{**_fields(p), "capacity": rank}))
    return out


def _fields(device: ClockDevice) -> dict[str, Any]:
    return {
        "kind": device.kind,
        "name": device.name,
        "path": device.path,
        "cpus": device.cpus,
        "compatible": device.compatible,
        "governors": device.governors,
        "frequencies": device.frequencies,
        "files": device.files,
    }


def discover(sysfs: Path) -> tuple[ClockDevice, ...]:
    """Every cpufreq policy and devfreq device under ``sysfs`` (none on a board or VM
    without them: that is a fact, not an error), in a stable order."""
    found: list[ClockDevice] = []
    for kind_dir, reader in ((CPUFREQ_DIR, _cpufreq), (DEVFREQ_DIR, _devfreq)):
        try:
            entries = sorted((sysfs / kind_dir).iterdir(), key=lambda p: p.name)
        except OSError:
            continue
        for entry in entries:
            if kind_dir == CPUFREQ_DIR and not entry.name.startswith("policy"):
                continue
            device = reader(entry)
            if device is not None:
                found.append(device)
    policies = [d for d in found if d.kind == "cpufreq"]
    return (*_ranked(sysfs, policies), *(d for d in found if d.kind == "devfreq"))
