"""on_governor_exit = "kill": the engine must not run on unnoticed if the governor dies.

Two mechanisms, because each covers what the other cannot:
- the engine gets PR_SET_PDEATHSIG = SIGKILL (set in the child after dropping privileges), so
  it dies the moment the governor does — but that reaches only the engine, not its children;
- a watchdog process blocks on a pipe whose only writer is the governor. When the governor
  dies (even by SIGKILL) the kernel closes the pipe; the watchdog reads EOF, writes cgroup.kill
  on the group (the whole subtree, race-free against forks) and removes the cgroups. A governor
  that exits normally disarms it.

The watchdog is forked FIRST, before the governor imports anything but ``os`` and ``json``
(``governor.main``), so it is a copy of a nearly empty interpreter: its private memory is what
it touches after the fork, and it touches almost nothing while it waits. The cgroups it must
remove reach it later as one JSON line on the pipe (:meth:`Watchdog.arm`); only when it has to
act does it import the backend.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from typing import Any

_IGNORED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGPIPE,
)
DISARM = b"disarm\n"


class Watchdog:
    """The governor's end of the pipe."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd: int | None = fd

    def arm(self, plan: dict[str, Any]) -> None:
        """From now on, the governor's death kills and removes ``plan``'s cgroups (a plan
        dict: governor.plan.model.Plan.to_dict())."""
        self._send(json.dumps({"plan": plan}).encode() + b"\n")

    def disarm(self) -> None:
        """The governor cleans up (or has nothing to clean): the watchdog exits untouched."""
        if self.fd is None:
            return
        try:
            self._send(DISARM)
        finally:
            os.close(self.fd)
            self.fd = None
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)

    def _send(self, data: bytes) -> None:
        if self.fd is None:
            raise ValueError("watchdog already disarmed")
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def fork_watchdog() -> Watchdog:
    """Fork the watchdog now (call it before heavy imports); it waits, unarmed."""
    r, w = os.pipe2(os.O_CLOEXEC)  # the engine never holds either end
    pid = os.fork()
    if pid == 0:  # pragma: no cover - observed through its effects (tests kill the governor)
        code = 0
        try:
            os.close(w)
            code = _watch(r)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(r)
    return Watchdog(pid, w)


def _watch(r: int) -> int:
    os.setsid()  # not in the terminal's process group: ^C is for the governor
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    buf = b""
    while True:
        try:
            chunk = os.read(r, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        buf += chunk
    lines = buf.split(b"\n")
    if DISARM.strip() in lines:
        return 0
    armed = [line for line in lines if line.startswith(b"{")]
    if not armed:
        return 0  # the governor died before it made anything
    spec = json.loads(armed[-1])
    return _clean_up(spec["plan"])


def _clean_up(plan_dict: dict[str, Any]) -> int:
    """The governor is gone: kill the group and remove the cgroups, like its own exit would."""
    from pathlib import Path

    from governor.backends.cgroupfs import CgroupfsBackend
    from governor.kernel.cgroupfs import CgroupFs
    from governor.log import get_logger
    from governor.plan.model import Plan

    log = get_logger(__name__)
    plan = Plan.from_dict(plan_dict)
    log.warning("watchdog.governor_gone", action="kill", cgroup=plan.group)
    try:
        CgroupfsBackend(CgroupFs(Path(plan.cgroup_root))).remove(plan)
    except Exception as err:
        log.error("watchdog.failed", error=str(err))
        return 1
    return 0
