"""A stop signal while the supervisor applies the plan (a memory.max write can block in reclaim
on a real kernel) rolls everything back, as ^C always did, and the run ends with 128+N.

Needs: a tmp directory (the fake tree); the signal is real (os.kill of this process).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from governor.backends.cgroupfs import CgroupfsBackend
from governor.errors import Interrupted
from governor.kernel import files
from governor.kernel.procfs import ProcFs
from governor.launch.launcher import ChildSetup, Launcher
from governor.supervise.supervisor import Job, Supervisor

from .fakekernel import FakeKernelCgroupFs
from .plans import GROUP, make_plan, snapshot


class SignalledFs(FakeKernelCgroupFs):
    """Sends ``signum`` to this process right after the ``nth`` limit write (the fake's own
    subtree_control bookkeeping happens after its write, so those are not counted)."""

    def __init__(self, root: Path, signum: int, nth: int) -> None:
        super().__init__(root)
        self.signum, self.nth, self.writes = signum, nth, 0

    def write(self, cgroup: str, file: str, value: str) -> None:
        super().write(cgroup, file, value)
        if file == files.CGROUP_SUBTREE_CONTROL:
            return
        self.writes += 1
        if self.writes == self.nth:
            os.kill(os.getpid(), self.signum)  # delivered before the next bytecode


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_during_apply_rolls_back_and_exits_128_plus_n(
    cgroup_root: Path, signum: int
) -> None:
    fs = SignalledFs(cgroup_root, signum, nth=2)
    before = snapshot(cgroup_root)
    plan = make_plan()
    setup = ChildSetup(executable="/bin/true", argv=("/bin/true",), env={}, pdeathsig=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    supervisor = Supervisor(CgroupfsBackend(fs), Launcher(fs), proc=ProcFs(), watchdog=None)
    with pytest.raises(Interrupted) as err:
        supervisor.run(Job(plan=plan, setup=setup))
    assert err.value.exit_code == 128 + signum
    assert fs.writes >= 2
    assert not fs.exists(GROUP), "the group was left behind"
    assert snapshot(cgroup_root) == before, "a limit stayed applied"
    # the handlers are the process's own again afterwards
    assert {s: signal.getsignal(s) for s in handlers} == handlers


class StormFs(SignalledFs):
    """Sends the signal at the ``nth`` limit write and at every write after it (the rollback's
    own restoring writes included): an operator pressing ^C again and again."""

    def write(self, cgroup: str, file: str, value: str) -> None:
        FakeKernelCgroupFs.write(self, cgroup, file, value)
        if file == files.CGROUP_SUBTREE_CONTROL:
            return
        self.writes += 1
        if self.writes >= self.nth:
            os.kill(os.getpid(), self.signum)


def test_more_signals_during_the_rollback_do_not_cut_it_short(cgroup_root: Path) -> None:
    fs = StormFs(cgroup_root, signal.SIGTERM, nth=2)
    before = snapshot(cgroup_root)
    setup = ChildSetup(executable="/bin/true", argv=("/bin/true",), env={}, pdeathsig=False)
    supervisor = Supervisor(CgroupfsBackend(fs), Launcher(fs), proc=ProcFs(), watchdog=None)
    with pytest.raises(Interrupted):
        supervisor.run(Job(plan=make_plan(), setup=setup))
    assert fs.writes > 2, "the rollback restored values (and was signalled meanwhile)"
    assert snapshot(cgroup_root) == before
