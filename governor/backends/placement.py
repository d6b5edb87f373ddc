"""Where the engine's unit is under systemd, at run time: this process reads its own cgroup and
:func:`pick`s one of the places compiled ahead (:mod:`governor.plan.placement`)."""

from __future__ import annotations

from pathlib import Path

from governor.errors import HostError
from governor.kernel.procfs import ProcFs
from governor.plan.placement import CompiledPlacement, Mode
from governor.record import record


def parse_proc_cgroup(text: str) -> str:
    """The cgroup2 path (relative to the mount) from /proc/PID/cgroup's ``0::/path`` line."""
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            return path.strip("/")
    raise ValueError("no cgroup2 (0::) line in /proc/self/cgroup")


@record(frozen=True)
class Placement:
    mode: Mode
    unit: str  # the unit name
    cgroup: str  # U, relative to the cgroup root


def pick(placements: tuple[CompiledPlacement, ...], own_cgroup: str) -> CompiledPlacement:
    """The service's placement when this process is that service's main process, else the
    scope's; HostError when the service runs outside its policy slice."""
    by_mode = {p.mode: p for p in placements}
    service, scope = by_mode["service"], by_mode["scope"]
    if own_cgroup.rsplit("/", 1)[-1] != service.unit:
        return scope
    if own_cgroup != service.cgroup:
        raise HostError(
            f"{service.unit} runs in /{own_cgroup}, not in its policy slice /{service.cgroup}"
            " (/proc/self/cgroup)",
            hint=f"run `governor install {service.plan.source or service.plan.policy}` and"
            " `systemctl daemon-reload`, then restart the service",
        )
    return service


def own_cgroup(proc_root: Path) -> str:
    proc = ProcFs(proc_root)
    try:
        return parse_proc_cgroup(proc.self_cgroup())
    except (OSError, ValueError) as err:
        raise HostError(
            f"cannot read this process's cgroup ({proc.path('self', 'cgroup')}: {err})"
        ) from err
