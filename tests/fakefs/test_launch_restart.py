"""The launcher's restart loop (governor/launch/launcher.py supervise_restarting) with real
child processes (/bin/sh) on a fake cgroup tree; a scripted watcher stands in for the monitor
and asks for restarts the way the `restart` action does. The clock and the backoff's sleep are
fake. Needs: a tmp directory, fork/exec, /bin/sh, pidfd_open (Linux 5.3)."""

from __future__ import annotations

import os
import select
import signal
from pathlib import Path

import pytest

from governor.backends.cgroupfs import CgroupfsBackend
from governor.kernel import clone
from governor.launch.launcher import ChildSetup, Launcher
from governor.log import capture_logs
from governor.monitor.restart import Restarts
from governor.plan.model import Plan

from .fakekernel import FakeKernelCgroupFs
from .plans import make_plan


class ScriptedWatcher:
    """Waits for the engine's pidfd; after each exit asks for a restart (as the restart action
    does: only when the budget does not refuse), ``ask`` times at most."""

    def __init__(self, restarts: Restarts, *, ask: int, on_wait: object = None) -> None:
        self.restarts = restarts
        self.ask = ask
        self.on_wait = on_wait
        self.started: list[int] = []
        self.exits = 0

    def wait(self, exit_fd: int, limit_s: float | None) -> bool:
        if callable(self.on_wait):
            self.on_wait()
            self.on_wait = None
        return bool(select.select([exit_fd], [], [], 10)[0])

    def engine_exited(self) -> None:
        self.exits += 1
        if self.exits <= self.ask and self.restarts.refusal() is None:
            self.restarts.request(rule=0, when="oom_kill")

    def engine_started(self, pid: int) -> None:
        self.started.append(pid)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.on_sleep: object = None

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s
        if callable(self.on_sleep):
            self.on_sleep()


def _setup(argv: list[str]) -> ChildSetup:
    return ChildSetup(executable=argv[0], argv=tuple(argv), env=dict(os.environ))


@pytest.fixture
def plan(fake_fs: FakeKernelCgroupFs) -> Plan:
    plan = make_plan()
    CgroupfsBackend(fake_fs).apply(plan)
    return plan


def _launcher(fake_fs: FakeKernelCgroupFs, t: FakeTime) -> Launcher:
    return Launcher(fake_fs, clock=t.clock, sleep=t.sleep)


def test_the_engine_is_started_again_until_the_limit_with_doubling_backoff(
    fake_fs: FakeKernelCgroupFs, plan: Plan, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    setup = _setup(["/bin/sh", "-c", f'echo $$ >> "{runs}"; exit 3'])
    t = FakeTime()
    launcher = _launcher(fake_fs, t)
    restarts = Restarts(limit=2, base_s=1.0)
    watcher = ScriptedWatcher(restarts, ask=10)
    first = launcher.start(plan, setup)
    pid, code, sig = launcher.supervise_restarting(
        plan, setup, first, watcher=watcher, restarts=restarts
    )
    pids = [int(x) for x in runs.read_text().split()]
    assert len(pids) == 3 and pids[0] == first and pids[-1] == pid
    assert watcher.started == pids[1:]
    assert (code, sig) == (3, None)  # the last run's status, as without restart
    assert [(h["attempt"], h["backoff_s"], h["exit_code"]) for h in restarts.history] == [
        (1, 1.0, 3),
        (2, 2.0, 3),
    ]
    assert sum(t.slept) == pytest.approx(3.0)  # 1 s, then 2 s
    assert restarts.refusal() == "restart limit 2 reached"


def test_no_restart_asked_means_one_run(
    fake_fs: FakeKernelCgroupFs, plan: Plan, tmp_path: Path
) -> None:
    setup = _setup(["/bin/sh", "-c", "kill -KILL $$"])
    t = FakeTime()
    restarts = Restarts(limit=3, base_s=1.0)
    watcher = ScriptedWatcher(restarts, ask=0)
    launcher = _launcher(fake_fs, t)
    first = launcher.start(plan, setup)
    assert launcher.supervise_restarting(
        plan, setup, first, watcher=watcher, restarts=restarts
    ) == (first, 137, signal.SIGKILL)
    assert restarts.history == [] and t.slept == []


def test_an_operator_sigterm_is_forwarded_and_never_answered_with_a_relaunch(
    fake_fs: FakeKernelCgroupFs, plan: Plan
) -> None:
    setup = _setup(["/bin/sh", "-c", "exec sleep 30"])
    t = FakeTime()
    restarts = Restarts(limit=3, base_s=1.0)
    # the operator's SIGTERM reaches the governor while it waits for the engine
    watcher = ScriptedWatcher(
        restarts, ask=10, on_wait=lambda: os.kill(os.getpid(), signal.SIGTERM)
    )
    launcher = _launcher(fake_fs, t)
    first = launcher.start(plan, setup)
    pid, code, sig = launcher.supervise_restarting(
        plan, setup, first, watcher=watcher, restarts=restarts
    )
    assert pid == first and (code, sig) == (128 + signal.SIGTERM, signal.SIGTERM)
    assert restarts.stopped_by == "SIGTERM"
    assert restarts.history == [] and watcher.started == []


def test_ctrl_c_during_the_backoff_cancels_the_relaunch(
    fake_fs: FakeKernelCgroupFs, plan: Plan, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    setup = _setup(["/bin/sh", "-c", f'echo $$ >> "{runs}"; exit 3'])
    t = FakeTime()
    t.on_sleep = lambda: os.kill(os.getpid(), signal.SIGINT)
    restarts = Restarts(limit=3, base_s=5.0)
    watcher = ScriptedWatcher(restarts, ask=10)
    launcher = _launcher(fake_fs, t)
    first = launcher.start(plan, setup)
    assert launcher.supervise_restarting(
        plan, setup, first, watcher=watcher, restarts=restarts
    ) == (first, 3, None)
    assert len(runs.read_text().split()) == 1
    assert sum(t.slept) < 5.0  # stopped inside the backoff
    (entry,) = restarts.history
    assert entry["cancelled"] == "SIGINT"


def test_a_relaunch_that_cannot_exec_ends_with_the_last_status(
    fake_fs: FakeKernelCgroupFs, plan: Plan, tmp_path: Path
) -> None:
    engine = tmp_path / "engine.sh"
    engine.write_text('#!/bin/sh\nrm -f "$0"\nexit 3\n')  # gone before the relaunch
    engine.chmod(0o755)
    setup = _setup([str(engine)])
    t = FakeTime()
    restarts = Restarts(limit=3, base_s=1.0)
    watcher = ScriptedWatcher(restarts, ask=10)
    launcher = _launcher(fake_fs, t)
    first = launcher.start(plan, setup)
    assert launcher.supervise_restarting(
        plan, setup, first, watcher=watcher, restarts=restarts
    ) == (first, 3, None)
    (entry,) = restarts.history
    assert "engine not found" in entry["error"]


def test_a_relaunch_waits_for_the_killed_runs_leftovers_and_refuses_when_they_stay(
    fake_fs: FakeKernelCgroupFs, plan: Plan
) -> None:
    from governor.launch import launcher as launcher_mod
    from governor.log import capture_logs

    t = FakeTime()
    launcher = Launcher(fake_fs, clock=t.clock, sleep=t.sleep)
    fake_fs.add_process(plan.leaf, 777)  # a child of the killed engine, still exiting

    def exit_after_three_ticks() -> None:
        if len(t.slept) == 3:
            fake_fs.reap(777)

    t.on_sleep = exit_after_three_ticks
    assert launcher._wait_group_empty(plan.group) is True
    assert len(t.slept) == 3 and fake_fs.events(plan.group)["populated"] == 0

    fake_fs.add_process(plan.leaf, 778)  # one that never goes (D state)
    t.on_sleep = None
    with capture_logs() as logs:
        assert launcher._wait_group_empty(plan.group) is False  # no relaunch on top of it
    assert t.now >= launcher_mod.RESTART_EMPTY_TIMEOUT_S
    assert [(e["event"], e["log_level"]) for e in logs] == [("engine.restart_group_busy", "error")]


def _clone_into_as_6_18(fake_fs: FakeKernelCgroupFs, born: list[int]) -> object:
    """clone3(CLONE_INTO_CGROUP) as Linux 6.18 does it: the child is SIGKILLed as it is born
    when the target's kill_seq differs from the parent's cgroup's (this process's, outside the
    fake tree: never killed, 0). ``born`` collects the children it made."""

    def clone_into(cgroup_fd: int) -> tuple[int, int]:
        target = Path(os.readlink(f"/proc/self/fd/{cgroup_fd}")).relative_to(fake_fs.root)
        killed_at_birth = fake_fs.kill_seq.get(str(target), 0) != 0
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            if killed_at_birth:
                os.kill(os.getpid(), signal.SIGKILL)
            return 0, -1
        born.append(pid)
        return pid, os.pidfd_open(pid)

    return clone_into


class KillingWatcher(ScriptedWatcher):
    """Asks for the restart the way the `restart` action does: cgroup.kill of the group."""

    def __init__(self, restarts: Restarts, fs: FakeKernelCgroupFs, group: str) -> None:
        super().__init__(restarts, ask=10)
        self.fs, self.group = fs, group

    def engine_exited(self) -> None:
        self.fs.kill(self.group)
        super().engine_exited()


def test_a_relaunch_into_the_leaf_the_restart_killed_runs_the_engine_on_6_18(
    fake_fs: FakeKernelCgroupFs, plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # compat-6.18's restart test: the relaunch born in the killed leaf died at once (137)
    born: list[int] = []
    monkeypatch.setattr(clone, "clone_into", _clone_into_as_6_18(fake_fs, born))
    runs = tmp_path / "runs"
    setup = _setup(["/bin/sh", "-c", f'echo $$ >> "{runs}"; exit 3'])
    t = FakeTime()
    launcher = _launcher(fake_fs, t)
    restarts = Restarts(limit=2, base_s=1.0)
    watcher = KillingWatcher(restarts, fake_fs, plan.group)
    first = launcher.start(plan, setup)
    with capture_logs() as logs:
        pid, code, sig = launcher.supervise_restarting(
            plan, setup, first, watcher=watcher, restarts=restarts
        )
    pids = [int(x) for x in runs.read_text().split()]
    assert len(pids) == 3 and pids[0] == first and pids[-1] == pid  # every relaunch ran
    assert (code, sig) == (3, None)
    assert [h["exit_code"] for h in restarts.history] == [3, 3]
    # born in the leaf the first time; the second birth was killed, then fork and join
    assert len(born) == 2 and born[0] == first and born[1] not in pids
    assert [e["event"] for e in logs if e["event"] == "launch.killed_at_birth"] == [
        "launch.killed_at_birth"
    ]
    assert launcher.clone_into_cgroup is False


def test_an_exec_failure_is_still_reported_after_the_child_said_it_ran(
    fake_fs: FakeKernelCgroupFs, plan: Plan, tmp_path: Path
) -> None:
    from governor.errors import LaunchError

    launcher = _launcher(fake_fs, FakeTime())
    with pytest.raises(LaunchError, match="engine not found"):
        launcher.start(plan, _setup([str(tmp_path / "missing")]))


def test_a_first_launch_into_a_leaf_a_cgroup_kill_reached_before_runs_the_engine(
    fake_fs: FakeKernelCgroupFs, plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a kept group killed earlier (the watchdog, another governor's shed): the first birth dies
    born: list[int] = []
    monkeypatch.setattr(clone, "clone_into", _clone_into_as_6_18(fake_fs, born))
    fake_fs.kill(plan.group)
    runs = tmp_path / "runs"
    launcher = _launcher(fake_fs, FakeTime())
    pid = launcher.start(plan, _setup(["/bin/sh", "-c", f'echo $$ >> "{runs}"']))
    assert os.waitpid(pid, 0)[1] == 0  # it ran to its end
    assert [int(x) for x in runs.read_text().split()] == [pid] and born != [pid]
