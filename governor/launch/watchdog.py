"""on_governor_exit = "kill": the engine must not run on unnoticed if the governor dies.

Two mechanisms, because each covers what the other cannot:
- the engine gets PR_SET_PDEATHSIG = SIGKILL (set in the child after dropping privileges), so
  it dies the moment the governor does — but that reaches only the engine, not its children;
- a small watchdog process, forked before the engine, blocks on a pipe whose only writer is the
  governor. When the governor dies (even by SIGKILL) the kernel closes the pipe; the watchdog
  reads EOF, writes cgroup.kill on the group (the whole subtree, race-free against forks) and
  removes the cgroups. A governor that exits normally disarms it by writing one byte.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from governor.log import get_logger

log = get_logger(__name__)


@dataclass
class Watchdog:
    pid: int
    fd: int

    def disarm(self) -> None:
        """The governor cleaned up itself: tell the watchdog to exit without acting."""
        try:
            os.write(self.fd, b"x")
        finally:
            os.close(self.fd)
            os.waitpid(self.pid, 0)


def start_watchdog(on_orphaned: Callable[[], None]) -> Watchdog:
    r, w = os.pipe()  # both ends close-on-exec: the engine never holds them
    pid = os.fork()
    if pid == 0:  # pragma: no cover - observed through its effects (tests kill the governor)
        code = 0
        try:
            os.close(w)
            os.setsid()  # not in the terminal's process group: ^C is for the governor
            for sig in (
                signal.SIGINT,
                signal.SIGTERM,
                signal.SIGHUP,
                signal.SIGQUIT,
                signal.SIGUSR1,
                signal.SIGUSR2,
            ):
                signal.signal(sig, signal.SIG_IGN)
            while True:
                try:
                    data = os.read(r, 1)
                    break
                except InterruptedError:
                    continue
            if not data:
                log.warning("watchdog.governor_gone", action="kill")
                on_orphaned()
        except BaseException as err:  # never return into the governor's code
            log.error("watchdog.failed", error=str(err))
            code = 1
        finally:
            os._exit(code)
    os.close(r)
    log.debug("watchdog.armed", pid=pid)
    return Watchdog(pid=pid, fd=w)
