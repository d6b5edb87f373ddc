"""Monitor actions and the monitor loop on a fake cgroup tree (governor/monitor).

Needs: a tmp directory. In a fake tree the kernfs files are regular files: epoll refuses them,
so the monitor falls back to polling (PSI ``total=`` and the event files at every sample),
which is exactly the fallback path a host without triggers takes."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Literal

import pytest

from governor.backends.cgroupfs import CgroupfsBackend
from governor.compile.compiler import compile_action, watch_rule
from governor.errors import BackendError
from governor.kernel import files
from governor.kernel.procfs import ProcFs
from governor.log import capture_logs
from governor.monitor.actions.base import Context, Env
from governor.monitor.actions.executor import Executor
from governor.monitor.loop import Monitor
from governor.monitor.restart import Restarts
from governor.monitor.sources import Board
from governor.plan.model import Action, Plan, WatchCondition, WatchRule, WatchTrigger
from governor.policy.values import parse_action as parse_policy_action
from governor.record import replace

from .fakekernel import FakeKernelCgroupFs
from .plans import GROUP, LEAF, MEMORY_HIGH, MEMORY_MAX, MEMORY_MIN, make_plan


def parse_action(text: str) -> Action:
    return compile_action(parse_policy_action(text))


CTX = Context(rule=0, when="memory some 150ms/2s")


def _applied(fs: FakeKernelCgroupFs, **watch: object) -> Plan:
    plan = make_plan()
    CgroupfsBackend(fs).apply(plan)
    return plan


def _kset(fs: FakeKernelCgroupFs, cgroup: str, file: str, text: str) -> None:
    (fs.path(cgroup) / file).write_text(text)


def _executor(fs: FakeKernelCgroupFs, plan: Plan, **kw: object) -> Executor:
    return Executor(Env(fs, plan, engine_pids=lambda: [4242], **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("action", "start", "expected"),
    [
        ("set memory.high -10%", MEMORY_HIGH, MEMORY_HIGH * 9 // 10 // 4096 * 4096),
        ("set memory.high +50%", MEMORY_HIGH, MEMORY_MAX),  # never above the plan's max
        ("set memory.high -50%", MEMORY_HIGH, MEMORY_MIN),  # never below memory.min
        ("set memory.high 4G", MEMORY_HIGH, MEMORY_MAX),
        ("set memory.high max", MEMORY_HIGH, MEMORY_MAX),
    ],
)
def test_set_memory_high_stays_within_the_policy_bounds(
    fake_fs: FakeKernelCgroupFs, action: str, start: int, expected: int
) -> None:
    plan = _applied(fake_fs)
    _kset(fake_fs, GROUP, files.MEMORY_HIGH, f"{start}\n")
    res = _executor(fake_fs, plan).execute(parse_action(action), CTX)
    assert res.ok, res
    assert res.before == str(start)
    assert fake_fs.read(GROUP, files.MEMORY_HIGH).strip() == str(expected)


def test_set_relative_to_max_uses_the_plans_memory_max(fake_fs: FakeKernelCgroupFs) -> None:
    plan = _applied(fake_fs)
    _kset(fake_fs, GROUP, files.MEMORY_HIGH, "max\n")
    _executor(fake_fs, plan).execute(parse_action("set memory.high -10%"), CTX)
    assert int(fake_fs.read(GROUP, files.MEMORY_HIGH)) == MEMORY_MAX * 9 // 10 // 4096 * 4096


@pytest.mark.parametrize("start", ["max", "max\n"])
def test_raising_max_by_a_percentage_is_a_no_op_never_a_tightening(
    fake_fs: FakeKernelCgroupFs, start: str
) -> None:
    plan = _applied(fake_fs)
    _kset(fake_fs, GROUP, files.MEMORY_HIGH, start)
    res = _executor(fake_fs, plan).execute(parse_action("set memory.high +10%"), CTX)
    assert res.ok, res
    assert fake_fs.read(GROUP, files.MEMORY_HIGH).strip() == "max"


def test_cpu_weight_is_clamped_to_the_kernel_range(fake_fs: FakeKernelCgroupFs) -> None:
    plan = _applied(fake_fs)
    _executor(fake_fs, plan).execute(parse_action("set cpu.weight -99.99%"), CTX)
    assert fake_fs.read(GROUP, files.CPU_WEIGHT).strip() == "1"


def test_reclaim_tolerates_eagain_and_reports_usage_before_and_after(
    fake_fs: FakeKernelCgroupFs,
) -> None:
    plan = _applied(fake_fs)
    # no memory.reclaim and no memory.high (no memory controller): a failure, logged and
    # reported, never raised
    (fake_fs.path(GROUP) / files.MEMORY_HIGH).unlink()
    res = _executor(fake_fs, plan).execute(parse_action("reclaim 64M"), CTX)
    assert not res.ok and "memory.reclaim" in (res.detail or "")
    _kset(fake_fs, GROUP, files.MEMORY_RECLAIM, "")
    res = _executor(fake_fs, plan).execute(parse_action("reclaim 64M"), CTX)
    assert res.ok
    assert fake_fs.read(GROUP, files.MEMORY_RECLAIM) == str(64 << 20)


class _NoSwappinessArg(FakeKernelCgroupFs):
    """memory.reclaim before 6.11: a key after the amount is refused with EINVAL."""

    def write(self, cgroup: str, file: str, value: str) -> None:
        if file == files.MEMORY_RECLAIM and " " in value:
            raise BackendError("cannot write cgroup file", cgroup=cgroup, file=file, errno=22)
        super().write(cgroup, file, value)


def test_reclaim_passes_swappiness_where_the_kernel_takes_it_else_reclaims_without(
    fake_fs: FakeKernelCgroupFs, cgroup_root: Path
) -> None:
    # issue 47: memory.reclaim's swappiness= (6.11) where the kernel has it; before, the
    # amount alone (the board's vm.swappiness balances), said in the result
    plan = _applied(fake_fs)
    _kset(fake_fs, GROUP, files.MEMORY_RECLAIM, "")
    res = _executor(fake_fs, plan).execute(parse_action("reclaim 64M swappiness=0"), CTX)
    assert res.ok and res.detail is None
    assert fake_fs.read(GROUP, files.MEMORY_RECLAIM) == f"{64 << 20} swappiness=0"
    old = _NoSwappinessArg(cgroup_root)
    _kset(old, GROUP, files.MEMORY_RECLAIM, "")
    res = _executor(old, plan).execute(parse_action("reclaim 64M swappiness=0"), CTX)
    assert res.ok, res
    assert old.read(GROUP, files.MEMORY_RECLAIM) == str(64 << 20)
    assert "swappiness=0 refused (EINVAL: Linux < 6.11)" in (res.detail or "")


class _HighWrites(FakeKernelCgroupFs):
    """Records memory.high writes; writing memory.high below memory.current reclaims down to
    it (mm/memcontrol.c memory_high_write), as the kernel does within the write."""

    highs: list[str]

    def write(self, cgroup: str, file: str, value: str) -> None:
        super().write(cgroup, file, value)
        if file == files.MEMORY_HIGH:
            self.highs.append(value)
            current = int(self.read(cgroup, files.MEMORY_CURRENT))
            if value != "max" and current > int(value):
                _kset(self, cgroup, files.MEMORY_CURRENT, f"{value}\n")


@pytest.mark.parametrize(
    ("current", "reclaim", "want_high", "high"),
    [
        (MEMORY_MIN + (256 << 20), "64M", MEMORY_MIN + (192 << 20), str(MEMORY_HIGH)),
        (MEMORY_MIN + (256 << 20), "64M", MEMORY_MIN + (192 << 20), "max"),
        (MEMORY_MIN + (16 << 20), "64M", MEMORY_MIN, str(MEMORY_HIGH)),  # not below memory.min
    ],
)
def test_reclaim_without_memory_reclaim_lowers_memory_high_for_one_write_and_restores_it(
    cgroup_root: Path, current: int, reclaim: str, want_high: int, high: str
) -> None:
    """Linux < 5.19 (a board's 5.10) has no memory.reclaim: the action still reclaims, by a
    memory.high of current - N (not below memory.min) and the old value back at once."""
    fs = _HighWrites(cgroup_root)
    fs.highs = []
    plan = _applied(fs)
    _kset(fs, GROUP, files.MEMORY_CURRENT, f"{current}\n")
    _kset(fs, GROUP, files.MEMORY_HIGH, f"{high}\n")
    fs.highs.clear()
    res = _executor(fs, plan).execute(parse_action(f"reclaim {reclaim}"), CTX)
    assert res.ok, res
    assert fs.highs == [str(want_high), high]
    assert (res.before, res.after) == (current, want_high)
    assert "no memory.reclaim (Linux < 5.19)" in (res.detail or "")
    assert fs.read(GROUP, files.MEMORY_HIGH).strip() == high


def test_freeze_waits_for_frozen_then_thaws_by_itself(fake_fs: FakeKernelCgroupFs) -> None:
    plan = _applied(fake_fs)
    now = [100.0]
    ex = _executor(fake_fs, plan, clock=lambda: now[0])
    _kset(fake_fs, GROUP, files.CGROUP_EVENTS, "populated 1\nfrozen 1\n")  # the kernel, done
    res = ex.execute(parse_action("freeze 2s"), CTX)
    assert res.ok and res.after["frozen"] == 1
    assert fake_fs.read(GROUP, files.CGROUP_FREEZE).strip() == "1"
    assert ex.thaw_at == pytest.approx(102.0)
    never_quiet = lambda _rule, _cooldown: False  # noqa: E731 - the loop's quiet(), no rule
    assert ex.tick(101.0, never_quiet) == []
    _kset(fake_fs, GROUP, files.CGROUP_EVENTS, "populated 1\nfrozen 0\n")
    thawed = ex.tick(102.5, never_quiet)
    assert len(thawed) == 1 and thawed[0].result.ok
    assert fake_fs.read(GROUP, files.CGROUP_FREEZE).strip() == "0"


def test_kill_writes_cgroup_kill_of_the_group(fake_fs: FakeKernelCgroupFs) -> None:
    plan = _applied(fake_fs)
    fake_fs.add_process(LEAF, 4242)
    res = _executor(fake_fs, plan).execute(parse_action("kill"), CTX)
    assert res.ok and res.before == {"procs": 1}
    assert fake_fs.procs(LEAF) == []


def test_signal_goes_to_the_engine(fake_fs: FakeKernelCgroupFs) -> None:
    plan = _applied(fake_fs)
    sent: list[tuple[int, int]] = []
    ex = _executor(fake_fs, plan, kill=lambda pid, sig: sent.append((pid, sig)))
    assert ex.execute(parse_action("signal SIGUSR1"), CTX).ok
    assert sent == [(4242, signal.SIGUSR1)]


def test_exec_runs_without_a_shell_with_the_event_in_its_environment(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    plan = _applied(fake_fs)
    res = _executor(fake_fs, plan).execute(
        parse_action("exec sh -c 'echo $GOVERNOR_RULE:$GOVERNOR_WHEN'"), CTX
    )
    assert res.ok
    assert res.after["stdout"] == "0:memory some 150ms/2s\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to process.user needs root")
def test_exec_runs_as_the_policys_user_with_a_clean_environment(
    fake_fs: FakeKernelCgroupFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _applied(fake_fs)
    plan = replace(plan, launch=replace(plan.launch, user="nobody"))
    monkeypatch.setenv("GOVERNOR_TEST_SECRET", "s3cret")
    res = _executor(fake_fs, plan).execute(parse_action("exec sh -c 'id -un; env'"), CTX)
    assert res.ok, res
    out = res.after["stdout"]
    assert out.splitlines()[0] == "nobody"
    assert "s3cret" not in out
    assert "GOVERNOR_RULE=0" in out
    assert "PATH=/usr/local/sbin:" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to process.user needs root")
def test_exec_as_an_unknown_user_fails_and_runs_nothing(fake_fs: FakeKernelCgroupFs) -> None:
    plan = _applied(fake_fs)
    plan = replace(plan, launch=replace(plan.launch, user="no-such-user-xyz"))
    ran: list[object] = []
    ex = _executor(fake_fs, plan, run=lambda *a, **k: ran.append(a))
    res = ex.execute(parse_action("exec true"), CTX)
    assert not res.ok
    assert "no-such-user-xyz" in (res.detail or "")
    assert ran == []


def test_restart_without_a_launcher_fails_and_says_what_to_use(fake_fs: FakeKernelCgroupFs) -> None:
    plan = _applied(fake_fs)
    fake_fs.add_process(LEAF, 4242)
    res = _executor(fake_fs, plan).execute(parse_action("restart"), CTX)  # governor monitor
    assert not res.ok
    assert res.detail == "restart needs governor launch; under systemd use Restart=on-failure"
    assert fake_fs.procs(LEAF) == [4242]  # nothing killed


def test_restart_kills_the_group_and_asks_the_launcher_until_the_limit(
    fake_fs: FakeKernelCgroupFs,
) -> None:
    plan = _applied(fake_fs)
    restarts = Restarts(limit=1, base_s=2.0)
    ex = _executor(fake_fs, plan, restarts=restarts)
    fake_fs.add_process(LEAF, 4242)
    res = ex.execute(parse_action("restart"), CTX)
    assert res.ok, res
    assert res.before == {"procs": 1}
    assert res.after == {"attempt": 1, "limit": 1, "backoff_s": 2.0}
    assert fake_fs.procs(LEAF) == []  # cgroup.kill of the group, as the kill action
    req = restarts.take()
    assert req is not None and (req.rule, req.when) == (0, CTX.when)
    restarts.record(req, exit_code=137, sig=9)
    fake_fs.add_process(LEAF, 4243)  # the relaunched engine
    res = ex.execute(parse_action("restart"), CTX)
    assert not res.ok and res.detail == "restart limit 1 reached"
    assert fake_fs.procs(LEAF) == [4243]  # a refused restart kills nothing


def test_a_failed_kill_records_no_restart(fake_fs: FakeKernelCgroupFs) -> None:
    plan = _applied(fake_fs)
    (fake_fs.path(GROUP) / files.CGROUP_KILL).unlink()  # a kernel before 5.14
    fake_fs.add_process(LEAF, 4242)  # and a process SIGKILL does not end (D state)
    restarts = Restarts(limit=3, base_s=1.0)
    ticks = iter(range(100))
    ex = _executor(fake_fs, plan, restarts=restarts, kill=lambda pid, sig: None,
                   clock=lambda: float(next(ticks)))  # fmt: skip
    res = ex.execute(parse_action("restart"), CTX)
    assert not res.ok and "still in the group" in (res.detail or ""), res
    assert restarts.pending is None
    assert fake_fs.read(GROUP, files.CGROUP_FREEZE).strip() == "0"  # thawed again


class _Forks(FakeKernelCgroupFs):
    """A pre-5.14 kernel (no cgroup.kill) whose engine forks a child while it runs: frozen, it
    cannot fork (cgroup.freeze is honoured as the kernel's freezer would)."""

    forks: int

    def fork(self, cgroup: str, pid: int) -> None:
        if self.read(GROUP, files.CGROUP_FREEZE).strip() != "1":
            self.add_process(cgroup, pid)
            self.forks += 1


@pytest.mark.parametrize("verb", ["kill", "restart"])
def test_kill_without_cgroup_kill_freezes_and_sigkills_every_pid_of_the_subtree(
    cgroup_root: Path, verb: str
) -> None:
    """Linux < 5.14 (a board's 5.10) has no cgroup.kill: the group is frozen first (nothing
    forks away), every pid of the group and its leaf gets SIGKILL until none is left, then it
    is thawed; the action succeeds and says how."""
    fs = _Forks(cgroup_root, has_kill=False)
    fs.forks = 0
    plan = _applied(fs)
    assert not (fs.path(GROUP) / files.CGROUP_KILL).exists()
    fs.add_process(LEAF, 4242)
    fs.add_process(GROUP, 4300)  # the prefetch helper, say
    sent: list[tuple[int, int]] = []
    freezes: list[str] = []

    def kill(pid: int, sig: int) -> None:
        freezes.append(fs.read(GROUP, files.CGROUP_FREEZE).strip())
        sent.append((pid, sig))
        fs.fork(LEAF, pid + 1000)  # a fork racing with the kill: only if not frozen
        fs.reap(pid)

    restarts = Restarts(limit=3, base_s=1.0) if verb == "restart" else None
    ex = _executor(fs, plan, kill=kill, restarts=restarts)
    res = ex.execute(parse_action(verb), CTX)
    assert res.ok, res
    assert res.detail == "no cgroup.kill (Linux < 5.14): froze the group, SIGKILLed each pid"
    assert sorted(sent) == [(4242, signal.SIGKILL), (4300, signal.SIGKILL)]
    assert set(freezes) == {"1"} and fs.forks == 0
    assert fs.procs(LEAF) == [] and fs.procs(GROUP) == []
    assert fs.read(GROUP, files.CGROUP_FREEZE).strip() == "0"


def test_kill_without_cgroup_kill_keeps_killing_what_slipped_past_a_round(
    cgroup_root: Path,
) -> None:
    """Where no freezer holds (cgroup.freeze missing too): SIGKILL rounds until no pid is
    left, so a child forked during the first round is killed by the next."""
    fs = _Forks(cgroup_root, has_kill=False)
    fs.forks = 0
    plan = _applied(fs)
    (fs.path(GROUP) / files.CGROUP_FREEZE).unlink()
    fs.add_process(LEAF, 4242)
    sent: list[int] = []

    def kill(pid: int, sig: int) -> None:
        sent.append(pid)
        if pid == 4242:
            fs.add_process(LEAF, 4243)  # forked just before it died
        fs.reap(pid)

    res = _executor(fs, plan, kill=kill).execute(parse_action("kill"), CTX)
    assert res.ok, res
    assert sent == [4242, 4243]
    assert fs.procs(LEAF) == []


# ---------------------------------------------------------------- the loop, polled


def _psi_text(total: int) -> str:
    return (
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )


def test_monitor_polls_psi_and_events_where_triggers_cannot_be_armed(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    watch = (
        watch_rule(
            index=0,
            trigger=WatchTrigger(
                resource="memory",
                kind="some",
                stall_us=150_000,
                window_us=2_000_000,
                file="memory.pressure",
            ),
            cooldown_s=5,
            actions=("log",),
        ),
        watch_rule(
            index=1,
            trigger=WatchCondition(condition="event", event="oom_kill", file="memory.events"),
            actions=("log",),
        ),
    )
    plan = replace(make_plan(), watch=watch)
    CgroupfsBackend(fake_fs).apply(plan)
    now = [0.0]
    mon = Monitor(
        Env(
            fake_fs,
            plan,
            engine_pids=lambda: [1],
            board=Board(ProcFs(tmp_path)),
            clock=lambda: now[0],
        )
    ).start()
    assert [a.mode for a in mon.armed] == ["polled"]  # a regular file takes no trigger
    stall = 0
    for step in range(12):
        now[0] = float(step)
        stall += 200_000  # 200 ms of stall each second
        _kset(fake_fs, GROUP, files.MEMORY_PRESSURE, _psi_text(stall))
        if step == 6:
            _kset(
                fake_fs,
                GROUP,
                files.MEMORY_EVENTS,
                "low 0\nhigh 9\nmax 1\noom 1\noom_kill 1\noom_group_kill 0\n",
            )
        mon.dispatch()
    out = mon.finish()
    fired = {r["rule"]: r["fired"] for r in out["rules"]}
    assert fired == {0: 2, 1: 1}  # cooldown 5 s over ~10 s of stall; one OOM kill
    assert out["oom_kill_seen"] == 1
    assert [f["rule"] for f in out["firings"]][:2] == [0, 1]
    assert out["sampler"]["samples"] == 12


def test_the_state_keeps_the_latest_firings_after_the_report_is_full(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report keeps the first MAX_REPORTED_FIRINGS; the published state's last actions
    must go on moving (a board that fired 200 times still shows what happened just now)."""
    from governor.monitor import loop

    monkeypatch.setattr(loop, "MAX_REPORTED_FIRINGS", 1)
    watch = (
        watch_rule(
            index=0,
            trigger=WatchCondition(condition="event", event="oom_kill", file="memory.events"),
            actions=("log",),
        ),
    )
    plan = replace(make_plan(), watch=watch)
    CgroupfsBackend(fake_fs).apply(plan)
    now = [0.0]
    mon = Monitor(
        Env(
            fake_fs,
            plan,
            engine_pids=lambda: [1],
            board=Board(ProcFs(tmp_path)),
            clock=lambda: now[0],
        )
    ).start()
    for kills in (1, 2, 3):
        now[0] = float(kills)
        _kset(fake_fs, GROUP, files.MEMORY_EVENTS, f"max {kills}\noom {kills}\noom_kill {kills}\n")
        mon.dispatch()
    out = mon.finish()
    assert len(out["firings"]) == 1 and out["firings"][0]["t_s"] == 1.0
    assert [f["t_s"] for f in mon.recent] == [1.0, 2.0, 3.0]


def test_a_stopping_monitor_never_leaves_the_group_frozen(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    plan = make_plan()
    CgroupfsBackend(fake_fs).apply(plan)
    mon = Monitor(
        Env(fake_fs, plan, engine_pids=lambda: [1], board=Board(ProcFs(tmp_path)))
    ).start()
    _kset(fake_fs, GROUP, files.CGROUP_EVENTS, "populated 1\nfrozen 1\n")
    assert mon.executor.execute(parse_action("freeze 60s"), CTX).ok
    _kset(fake_fs, GROUP, files.CGROUP_EVENTS, "populated 1\nfrozen 0\n")
    mon.finish()
    assert fake_fs.read(GROUP, files.CGROUP_FREEZE).strip() == "0"


def _oom_restart_plan() -> Plan:
    watch = (
        watch_rule(
            index=0,
            trigger=WatchCondition(condition="event", event="oom_kill", file="memory.events"),
            actions=("restart", "log"),
        ),
    )
    return replace(make_plan(), watch=watch)


def test_an_oom_kill_seen_only_after_the_exit_still_asks_for_the_restart(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    plan = _oom_restart_plan()
    CgroupfsBackend(fake_fs).apply(plan)
    restarts = Restarts(limit=2, base_s=1.0)
    mon = Monitor(Env(fake_fs, plan, board=Board(ProcFs(tmp_path)), restarts=restarts)).start()
    mon.engine_started(4242)
    fake_fs.add_process(LEAF, 4242)
    mon.dispatch()
    assert restarts.pending is None
    # the kernel killed the engine; the launcher saw the pidfd before memory.events changed
    fake_fs.reap(4242)
    _kset(fake_fs, GROUP, files.MEMORY_EVENTS, "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    mon.engine_exited()
    assert restarts.pending is not None and restarts.pending.when == "oom_kill"
    out = mon.finish()
    (firing,) = out["firings"]
    assert [a["action"] for a in firing["actions"]] == ["restart"]  # nothing left to act on
    assert out["oom_kill_seen"] == 1


def _memory_rule(index: int, stall_ms: int, kind: Literal["some", "full"] = "some") -> WatchRule:
    trig = WatchTrigger(
        resource="memory",
        kind=kind,
        stall_us=stall_ms * 1000,
        window_us=2_000_000,
        file="memory.pressure",
    )
    return watch_rule(index=index, trigger=trig, actions=("log",))


def test_psi_fallback_is_said_once_per_file_however_many_rules(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    cpu = WatchTrigger(
        resource="cpu", kind="some", stall_us=500_000, window_us=2_000_000, file="cpu.pressure"
    )
    watch = (
        _memory_rule(0, 150),
        _memory_rule(1, 300, "full"),
        watch_rule(index=2, trigger=cpu, actions=("log",)),
    )
    plan = replace(make_plan(), watch=watch)
    CgroupfsBackend(fake_fs).apply(plan)
    with capture_logs() as logs:
        mon = Monitor(
            Env(fake_fs, plan, engine_pids=lambda: [1], board=Board(ProcFs(tmp_path))),
            psi_triggers=False,
        ).start()
        for now in range(3):  # samples do not say it again
            mon._sample(float(now), set(), {})
        mon.finish()
    fallbacks = [e for e in logs if e["event"] == "psi.fallback"]
    assert [(e["file"], e["rules"]) for e in fallbacks] == [
        ("memory.pressure", [0, 1]),
        ("cpu.pressure", [2]),
    ]
    assert fallbacks[0]["detail"] == "polling memory.pressure every 1s"
    assert fallbacks[0]["reason"] == "PSI triggers disabled (--psi poll)"
    assert fallbacks[0]["log_level"] == "warning"
    assert [a.mode for a in mon.armed] == ["polled"] * 3


def test_a_missing_pressure_file_is_unavailable_said_once_and_never_fires(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    plan = replace(make_plan(), watch=(_memory_rule(0, 1), _memory_rule(1, 2)))
    CgroupfsBackend(fake_fs).apply(plan)
    (fake_fs.path(GROUP) / files.MEMORY_PRESSURE).unlink()  # psi=0 (--allow-missing psi)
    now = [0.0]
    with capture_logs() as logs:
        mon = Monitor(
            Env(
                fake_fs,
                plan,
                engine_pids=lambda: [1],
                board=Board(ProcFs(tmp_path)),
                clock=lambda: now[0],
            )
        ).start()
        for step in range(5):
            now[0] = float(step)
            mon.dispatch()
        out = mon.finish()
    events = [e["event"] for e in logs]
    assert events.count("psi.unavailable") == 1 and "psi.fallback" not in events
    (said,) = [e for e in logs if e["event"] == "psi.unavailable"]
    assert said["rules"] == [0, 1] and "memory.pressure" in said["reason"]
    assert [p["mode"] for p in out["psi"]] == ["unavailable", "unavailable"]
    assert [r["fired"] for r in out["rules"]] == [0, 0]


def test_a_pressure_file_that_refuses_triggers_is_polled_and_the_rule_fires(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    """The arm path of a real kernel that refuses the write (EOPNOTSUPP: before 5.2)."""
    plan = replace(make_plan(), watch=(_memory_rule(0, 150),))
    CgroupfsBackend(fake_fs).apply(plan)

    def refuse(cgroup: str, file: str, text: str) -> int:
        raise BackendError("cannot arm PSI trigger", cgroup=cgroup, file=file, errno=95)

    fake_fs.open_trigger = refuse  # type: ignore[method-assign]  # the kernel's answer
    now = [0.0]
    with capture_logs() as logs:
        mon = Monitor(
            Env(
                fake_fs,
                plan,
                engine_pids=lambda: [1],
                board=Board(ProcFs(tmp_path)),
                clock=lambda: now[0],
            )
        ).start()
        for step in range(4):
            now[0] = float(step)
            _kset(fake_fs, GROUP, files.MEMORY_PRESSURE, _psi_text(step * 100_000))
            mon.dispatch()
        out = mon.finish()
    (said,) = [e for e in logs if e["event"] == "psi.fallback"]
    assert "cannot arm PSI trigger" in said["reason"]
    assert out["psi"][0]["mode"] == "polled"
    assert out["rules"][0]["fired"] == 1  # 200 ms of stall within 2 s at t=2


def test_a_system_rule_watches_the_root_pressure_not_the_groups(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    """ "system memory some ..." is armed on the cgroup root, whose memory.pressure is the
    board's /proc/pressure/memory (kernel: the root cgroup's psi group is psi_system)."""
    trigger = _memory_rule(0, 150).trigger
    assert isinstance(trigger, WatchTrigger)
    system = replace(_memory_rule(0, 150), trigger=replace(trigger, system=True))
    plan = replace(make_plan(), watch=(system, _memory_rule(1, 150)))
    CgroupfsBackend(fake_fs).apply(plan)
    asked: list[str] = []

    def refuse(cgroup: str, file: str, text: str) -> int:
        asked.append(cgroup)
        raise BackendError("cannot arm PSI trigger", cgroup=cgroup, file=file, errno=95)

    fake_fs.open_trigger = refuse  # type: ignore[method-assign]  # polled from here on
    _kset(fake_fs, "", files.MEMORY_PRESSURE, _psi_text(0))  # the fake root has none yet
    now = [0.0]
    mon = Monitor(
        Env(
            fake_fs,
            plan,
            engine_pids=lambda: [1],
            board=Board(ProcFs(tmp_path)),
            clock=lambda: now[0],
        )
    ).start()
    assert asked == ["", GROUP]
    for step in range(4):  # the board stalls, the group does not
        now[0] = float(step)
        _kset(fake_fs, "", files.MEMORY_PRESSURE, _psi_text(step * 100_000))
        _kset(fake_fs, GROUP, files.MEMORY_PRESSURE, _psi_text(0))
        mon.dispatch()
    out = mon.finish()
    assert [r["fired"] for r in out["rules"]] == [1, 0]


def test_a_device_memory_rule_fires_on_the_groups_fdinfo_and_the_report_keeps_the_peak(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    """The monitor samples the group's dma-bufs (fdinfo of its processes, deduplicated by
    inode) when a `device memory` rule asks; the rule fires once per episode."""
    trigger = WatchCondition(condition="device", threshold=24 << 20, file="/proc/PID/fdinfo")
    plan = replace(make_plan(), watch=(watch_rule(0, trigger, ("log",)),))
    CgroupfsBackend(fake_fs).apply(plan)
    _kset(fake_fs, LEAF, files.CGROUP_PROCS, "7\n")
    fdinfo = tmp_path / "7" / "fdinfo"
    fdinfo.mkdir(parents=True)

    def hold(*sizes_mib: int) -> None:
        for f in fdinfo.iterdir():
            f.unlink()
        for i, mib in enumerate(sizes_mib):
            text = f"pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t{100 + i}\nsize:\t{mib << 20}\nexp_name:\tdrm\n"
            (fdinfo / str(3 + i)).write_text(text)
            (fdinfo / str(30 + i)).write_text(text)  # the same buffer again (mmap's dup)

    now = [0.0]
    mon = Monitor(
        Env(
            fake_fs,
            plan,
            engine_pids=lambda: [7],
            board=Board(ProcFs(tmp_path)),
            clock=lambda: now[0],
        )
    ).start()
    for step, held in enumerate([(16,), (16, 16), (16, 16), (16,), (16, 16, 16)]):
        now[0] = float(step)
        hold(*held)
        mon.dispatch()
    out = mon.finish()
    assert [f["value"] for f in out["firings"]] == [32 << 20, 48 << 20]
    assert out["device_memory_peak_bytes"] == 48 << 20
    assert out["device_memory_peak"] == [{"driver": "drm", "region": "dma-buf", "bytes": 48 << 20}]


def test_without_a_device_rule_or_budget_fdinfo_is_not_read(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    plan = make_plan()
    CgroupfsBackend(fake_fs).apply(plan)
    mon = Monitor(
        Env(fake_fs, plan, engine_pids=lambda: [7], board=Board(ProcFs(tmp_path)))
    ).start()
    mon.dispatch()
    assert "device_memory_peak_bytes" not in mon.finish()


def test_the_monitor_its_executor_and_handlers_read_one_frozen_env(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    """The Env is built once by whoever runs the monitor and handed down whole (issue 44): no
    constructor copies it into another, nobody reassigns a collaborator; what the handlers
    change is its shared part (the launched engine's pid, the freeze)."""
    plan = _applied(fake_fs)
    env = Env(fake_fs, plan, board=Board(ProcFs(tmp_path)), kill=lambda _pid, _sig: None)
    mon = Monitor(env)
    assert mon.env is env and mon.executor.env is env and mon.board is env.board
    with pytest.raises(AttributeError):
        env.fs = fake_fs  # type: ignore[misc]
    assert env.pids() == []  # launch: no engine yet
    mon.engine_started(4242)
    assert env.pids() == [4242] and env.shared.pid == 4242
    res = mon.executor.execute(parse_action("signal SIGUSR1"), CTX)
    assert res.ok and res.after == {"pids": [4242]}
    assert mon.executor.handlers and all(h.env is env for h in mon.executor.handlers.values())
