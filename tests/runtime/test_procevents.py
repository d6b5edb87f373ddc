"""The kernel's process events connector on this host (governor/kernel/procevents.py): as root
an exec anywhere wakes the waker; its thread ends at stop. Needs what tests/runtime/conftest.py
says (root), and CONFIG_PROC_EVENTS (Debian's kernels have it)."""

from __future__ import annotations

import subprocess
import threading

from governor.kernel.procevents import ExecWaker


def test_an_exec_wakes_the_waker() -> None:
    wake = threading.Event()
    waker = ExecWaker.start(wake)
    assert waker is not None, "no process events connector (CAP_NET_ADMIN, CONFIG_PROC_EVENTS)"
    try:
        wake.clear()
        subprocess.run(["/bin/true"], check=True)
        assert wake.wait(10)
        assert waker.execs >= 1
    finally:
        waker.stop()
    assert not waker._thread.is_alive()
