"""The systemd backend: the engine runs in a systemd unit whose cgroup subtree is delegated to
the governor (``governor launch --backend systemd``).

Two ways in, one layout (plan/unitmap.py explains the unit names):

- **service**: the governor is the main process of an installed ``governor@<name>.service``
  (Delegate=yes, in the policy's slice that ``governor install`` wrote). systemd already set
  the slice's limits; nothing goes over D-Bus.
- **scope**: anywhere else, the governor asks the manager for a transient scope
  ``governor-<name>.scope`` in ``<policy.slice>`` (StartTransientUnit, Delegate=yes, PIDs =
  the governor itself) carrying the policy's limits as properties, and waits for the job.

Then, in both cases, inside the unit's cgroup U: the governor moves itself to ``U/supervisor``
(no internal processes: U enables controllers for its children), creates ``U/engine``, writes
there what systemd cannot express (memory.oom.group, directives this systemd is too old for;
unitmap.split decides) and the launcher starts the engine in ``U/engine``. Removing kills and
removes only ``U/engine``; systemd removes U when the unit ends.
(systemd >= 254 has DelegateSubgroup= which would do the supervisor move itself; Debian 12
ships 252, see unitmap.DELEGATE_SUBGROUP_MIN_SYSTEMD.)

pystemd is imported lazily and only for the scope (and for daemon-reload in install); the
D-Bus signatures are our own table because pystemd's lacks several (AllowedCPUs "ay",
CPUWeight "t", MemoryMin "t", OOMPolicy "s", PIDs "au"; notes/kernel.md).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

from governor.backends.cgroupfs import Applied, CgroupfsBackend, Removed
from governor.backends.placement import Placement, own_cgroup, pick
from governor.backends.protect import at_least, protection
from governor.errors import BackendError, GovernorError, HostError, PermissionDenied
from governor.kernel.cgroupfs import CgroupFs
from governor.log import get_logger
from governor.plan import unitmap
from governor.plan.model import Plan
from governor.plan.placement import CompiledPlacement

log = get_logger(__name__)


# D-Bus signatures of every property this module (or the renderer) can send; a test checks
# that each directive and bus property in unitmap's tables has one (org.freedesktop.systemd1(5))
DBUS_SIGNATURES: dict[str, str] = {
    "Description": "s",
    "Slice": "s",
    "Delegate": "b",
    "PIDs": "au",
    "CollectMode": "s",
    "AddRef": "b",
    "TasksMax": "t",
    "MemorySwapMax": "t",
    "MemoryMin": "t",
    "MemoryLow": "t",
    "MemoryHigh": "t",
    "MemoryMax": "t",
    "IOWeight": "t",
    "CPUWeight": "t",
    "CPUQuotaPerSecUSec": "t",
    "CPUQuotaPeriodUSec": "t",
    "AllowedCPUs": "ay",
    "AllowedMemoryNodes": "ay",
    "OOMPolicy": "s",
    "OOMScoreAdjust": "i",
    "Nice": "i",
    "LimitMEMLOCK": "t",
    "Environment": "as",
}

SYSTEMD_DEST = b"org.freedesktop.systemd1"
SYSTEMD_PATH = b"/org/freedesktop/systemd1"
MANAGER_IFACE = b"org.freedesktop.systemd1.Manager"
UNIT_IFACE = b"org.freedesktop.systemd1.Unit"
SCOPE_IFACE = b"org.freedesktop.systemd1.Scope"
JOB_IFACE = b"org.freedesktop.systemd1.Job"
JOB_TIMEOUT_S = 120.0  # TCG guests start a scope in seconds; a real board in milliseconds
JOB_POLL_S = 0.05

PYSTEMD_HINT = (
    "pip install 'cgroup-governor[systemd]' (pystemd builds against libsystemd:"
    " apt-get install libsystemd-dev pkg-config gcc), or use --backend cgroupfs"
)

Prop = tuple[str, str, Any]  # (name, D-Bus signature, value)


# --- pure: properties, cgroup paths, the delegated plan -----------------------------------------


def signed(props: list[unitmap.DbusProp]) -> list[Prop]:
    out: list[Prop] = []
    for name, value in props:
        sig = DBUS_SIGNATURES.get(name)
        if sig is None:  # a programming error: the signature test keeps the table complete
            raise KeyError(f"no D-Bus signature for property {name}")
        out.append((name, sig, value))
    return out


def scope_properties(plan: Plan, systemd_version: int, pid: int) -> list[Prop]:
    """StartTransientUnit properties of the policy's scope: its limits and the delegation."""
    props: list[unitmap.DbusProp] = [
        ("Description", f"governor policy {plan.policy} (transient)"),
        ("Slice", plan.slice),
        ("Delegate", True),
        ("PIDs", [pid]),
        # a failed scope is garbage-collected too, so the name is free for the next launch
        ("CollectMode", "inactive-or-failed"),
    ]
    for setting in unitmap.split(plan, systemd_version).unit:
        props += setting.bus()
    if systemd_version >= unitmap.OOM_POLICY_SCOPE_MIN_SYSTEMD:
        props.append(("OOMPolicy", "continue"))
    return signed(props)


# --- the bus -------------------------------------------------------------------------------------


class Bus(Protocol):
    def start_transient_unit(self, name: str, props: list[Prop]) -> str: ...
    def job_pending(self, job: str) -> bool: ...
    def unit_property(self, unit: str, interface: bytes, prop: str) -> Any: ...
    def reload(self) -> None: ...


def _import_pystemd() -> Any:
    try:
        from pystemd import dbuslib
    except ImportError as err:
        raise HostError(
            "the systemd backend needs pystemd, which is not installed", hint=PYSTEMD_HINT
        ) from err
    return dbuslib


def _bus_error(err: Exception, action: str) -> GovernorError:
    name = getattr(err, "err_name", "") or ""
    message = getattr(err, "err_message", "") or str(err)
    if isinstance(message, bytes):
        message = message.decode(errors="replace")
    code = getattr(err, "errno", None)
    errno_ = -code if isinstance(code, int) and code < 0 else None
    if name.endswith(".UnitExists") or errno_ == errno.EEXIST:
        return HostError(
            f"{action}: a unit of that name already runs ({message})",
            hint="the policy is already running; stop it or use a different policy name",
        )
    if name.endswith("AccessDenied") or name.endswith("InteractiveAuthorizationRequired"):
        return PermissionDenied(f"{action}: {message}", errno=errno_, hint="run as root")
    return BackendError(f"{action}: {name} {message}".strip(), errno=errno_)


class PystemdBus:
    """The system bus through pystemd's sd-bus binding, with our own signature table."""

    def __init__(self) -> None:
        self._dbuslib = _import_pystemd()

    def _call(self, method: bytes, args: list[Any], action: str) -> Any:
        try:
            with self._dbuslib.DBus() as bus:
                return bus.call_method(SYSTEMD_DEST, SYSTEMD_PATH, MANAGER_IFACE, method, args).body
        except Exception as err:  # pystemd raises DBusError subclasses built at runtime
            raise _bus_error(err, action) from err

    def _args(self, signature: str, values: list[Any]) -> list[Any]:
        out: list[Any] = self._dbuslib.apply_signature(signature.encode(), values)
        return out

    def start_transient_unit(self, name: str, props: list[Prop]) -> str:
        args = self._args("ss", [name.encode(), b"fail"])
        args += [(ord("a"), b"(sv)")]
        for pname, sig, value in props:
            v = value.encode() if isinstance(value, str) else value
            args += [(ord("r"), b"sv"), (ord("s"), pname.encode()), (ord("v"), sig.encode())]
            args += self._args(sig, [v])
            args += [(-1, None), (-1, None)]
        args += [(-1, None)]
        args += [(ord("a"), b"(sa(sv))"), (-1, None)]  # no auxiliary units
        job = self._call(b"StartTransientUnit", args, f"cannot start transient unit {name}")
        return job.decode() if isinstance(job, bytes) else str(job)

    def job_pending(self, job: str) -> bool:
        try:
            with self._dbuslib.DBus() as bus:
                bus.get_property(SYSTEMD_DEST, job.encode(), JOB_IFACE, b"State", b"s")
        except Exception as err:
            # a finished job is removed: sd-bus answers "Unknown object" (-EBADR); pystemd
            # keeps the D-Bus error name only for errors it has no class for, so check all
            text = f"{getattr(err, 'err_name', '')} {getattr(err, 'err_message', '')} {err}"
            if getattr(err, "errno", None) == -errno.EBADR or "Unknown object" in text:
                return False
            raise _bus_error(err, f"cannot read job {job}") from err
        return True

    def unit_property(self, unit: str, interface: bytes, prop: str) -> Any:
        path = self._call(b"GetUnit", self._args("s", [unit.encode()]), f"no unit {unit}")
        sig = {"ActiveState": b"s", "ControlGroup": b"s", "Result": b"s"}[prop]
        try:
            with self._dbuslib.DBus() as bus:
                value = bus.get_property(SYSTEMD_DEST, path, interface, prop.encode(), sig)
        except Exception as err:
            raise _bus_error(err, f"cannot read {unit} {prop}") from err
        return value.decode() if isinstance(value, bytes) else value

    def reload(self) -> None:
        self._call(b"Reload", [], "daemon-reload failed")

    def version(self) -> str:
        try:
            with self._dbuslib.DBus() as bus:
                v = bus.get_property(SYSTEMD_DEST, SYSTEMD_PATH, MANAGER_IFACE, b"Version", b"s")
        except Exception as err:
            raise _bus_error(err, "cannot reach the systemd manager") from err
        return v.decode() if isinstance(v, bytes) else str(v)


def bus_answers() -> bool:
    """pystemd is installed and the manager answers on the system bus."""
    try:
        PystemdBus().version()
    except GovernorError:
        return False
    return True


_PROTECT_DIRECTIVE = {"memory.min": "MemoryMin", "memory.low": "MemoryLow"}


def set_runtime_property(unit: str, assignment: str, *, hint: str | None = None) -> None:
    """``systemctl set-property --runtime UNIT KEY=VALUE`` (until reboot; no pystemd needed)."""
    import subprocess

    try:
        subprocess.run(
            ["systemctl", "set-property", "--runtime", unit, assignment],
            check=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:
        raise BackendError(
            f"cannot set {assignment} on {unit}:"
            f" {str(getattr(err, 'stderr', '') or err).strip()} ({unit})",
            hint=hint
            or f"the policy's memory protection needs {unit} to grant it too;"
            f" set it by hand: systemctl set-property {unit} {assignment}",
        ) from err


def daemon_reload() -> str:
    """Reload unit files: over D-Bus when pystemd is there, else ``systemctl daemon-reload``."""
    import subprocess

    try:
        PystemdBus().reload()
        return "D-Bus Reload()"
    except HostError:
        pass  # no pystemd
    try:
        subprocess.run(
            ["systemctl", "daemon-reload"], check=True, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise BackendError(
            f"systemctl daemon-reload failed: {str(getattr(err, 'stderr', '') or err).strip()}"
            " (systemd, pid 1)",
            hint="is systemd running? reload later with `systemctl daemon-reload`",
        ) from err
    return "systemctl daemon-reload"


# --- the backend ---------------------------------------------------------------------------------


class SystemdBackend:
    """Same surface as CgroupfsBackend for api/launch.py: ``fs``, ``lock``, ``apply``, ``remove``.

    ``apply`` takes the *delegated* plan (see :func:`governor.compile.placements.delegated_plan`)."""

    def __init__(
        self,
        fs: CgroupFs,
        *,
        placement: Placement,
        full_plan: Plan,
        systemd_version: int,
        bus_factory: Callable[[], Bus] = PystemdBus,
        getpid: Callable[[], int] = os.getpid,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        job_timeout_s: float = JOB_TIMEOUT_S,
        set_property: Callable[[str, str], None] | None = None,
    ) -> None:
        self.fs = fs
        self.placement = placement
        self._full = full_plan
        self._version = systemd_version
        self._bus_factory = bus_factory
        self._getpid = getpid
        self._clock = clock
        self._sleep = sleep
        self._job_timeout_s = job_timeout_s
        self._cg = CgroupfsBackend(fs)
        self._set_property = set_property or set_runtime_property

    @contextmanager
    def lock(self, plan: Plan) -> Iterator[list[str]]:
        # the unit name is the lock: systemd refuses a second unit of the same name
        # (org.freedesktop.systemd1.UnitExists), and a service instance runs once
        yield []

    def _start_scope(self) -> None:
        bus = self._bus_factory()
        unit = self.placement.unit
        props = scope_properties(self._full, self._version, self._getpid())
        job = bus.start_transient_unit(unit, props)
        log.info("systemd.scope_started", unit=unit, job=job, properties=[p[0] for p in props])
        deadline = self._clock() + self._job_timeout_s
        while bus.job_pending(job):
            if self._clock() >= deadline:
                raise BackendError(
                    f"systemd job for {unit} did not finish in {self._job_timeout_s:g}s ({job})",
                    hint="see `systemctl status` and the journal",
                )
            self._sleep(JOB_POLL_S)
        state = bus.unit_property(unit, UNIT_IFACE, "ActiveState")
        cgroup = str(bus.unit_property(unit, SCOPE_IFACE, "ControlGroup")).strip("/")
        if state != "active" or cgroup != self.placement.cgroup:
            raise BackendError(
                f"transient scope {unit} is {state} in /{cgroup}, expected active in"
                f" /{self.placement.cgroup} ({unit})",
                hint=f"journalctl -u {unit}",
            )

    def apply(self, plan: Plan) -> Applied:
        if self.placement.mode == "scope":
            self._start_scope()
        unit_cg = self.placement.cgroup
        supervisor = f"{unit_cg}/{unitmap.SUPERVISOR_LEAF}"
        self.fs.mkdir(supervisor)
        # no internal processes: U enables controllers for its children only once it is empty.
        # The governor and what it started before (the /bin/sh watchdog) move together.
        self.fs.move(self._getpid(), supervisor)
        for pid in self.fs.procs(unit_cg):
            with suppress(GovernorError):  # one that exited meanwhile
                self.fs.move(pid, supervisor)
        log.info("systemd.supervisor", unit=self.placement.unit, cgroup=supervisor)
        self._protect_slices()
        return self._cg.apply(plan)

    def _protect_slices(self) -> None:
        """MemoryMin=/MemoryLow= of the slices above the unit, raised (runtime, through the
        manager, which owns those files) to the sum of their children's: a cgroup's protection
        is capped by its parent's, so the policy's MemoryMin= under a governor.slice with none
        would protect nothing. Never lowered: an idle slice's protection costs nothing (the
        kernel protects usage, up to memory.min)."""
        if not self._full.protect_parents or not self._full.slice.endswith(".slice"):
            return
        path = unitmap.slice_cgroup(self._full.slice)
        parts = path.split("/") if path else []
        for i in reversed(range(len(parts))):  # nearest first: each sum sees the one below
            cgroup, unit = "/".join(parts[: i + 1]), parts[i]
            for file in self._full.protect_parents:
                need = self._cg.children_protection(cgroup, file)
                live = self.fs.read(cgroup, file).strip()
                if at_least(protection(live), need):
                    continue
                value = "infinity" if need is None else str(need)
                self._set_property(unit, f"{_PROTECT_DIRECTIVE[file]}={value}")
                log.info("systemd.protect_slice", unit=unit, file=file, value=value, previous=live)

    def remove(self, plan: Plan, *, owned: Collection[str] | None = None) -> Removed:
        """Kill and remove the engine leaf only; U (and the supervisor in it) belong to systemd,
        which removes them when the unit ends."""
        return self._cg.remove(plan, owned=owned)


def for_launch(
    plan: Plan,
    *,
    systemd_version: int | None,
    proc_root: Path,
    placements: tuple[CompiledPlacement, ...],
) -> tuple[Plan, SystemdBackend]:
    """The delegated plan and the backend for ``governor launch --backend systemd``
    (``placements``: both places, compiled ahead by governor/compile/placements.py)."""
    if systemd_version is None:
        raise HostError(
            "--backend systemd: systemd is not PID 1 on this host (/proc/1/comm)",
            hint="use --backend cgroupfs (or auto)",
        )
    chosen = pick(placements, own_cgroup(proc_root))
    placement = Placement(chosen.mode, chosen.unit, chosen.cgroup)
    log.info("systemd.placement", mode=placement.mode, unit=placement.unit, cgroup=placement.cgroup)
    if placement.mode == "scope":
        _import_pystemd()  # fail before anything is applied, with the install hint
    backend = SystemdBackend(
        CgroupFs(Path(plan.cgroup_root)),
        placement=placement,
        full_plan=plan,
        systemd_version=systemd_version,
    )
    return chosen.plan, backend
