"""The refault rules in the monitor loop on a fake cgroup tree (issue 33): the group's share
from memory.stat at each sample, the board's from /proc/vmstat and /proc/meminfo, fired once
per episode, and the current share in the rule states (what `status` shows).

Needs: a tmp directory (a fake cgroup tree and a fake /proc)."""

from __future__ import annotations

from pathlib import Path

from governor.backends.cgroupfs import CgroupfsBackend
from governor.compile.compiler import _watch_trigger, watch_rule
from governor.kernel import files
from governor.kernel.procfs import ProcFs
from governor.monitor.actions.base import Env
from governor.monitor.loop import Monitor
from governor.monitor.sources import Board
from governor.plan.model import Plan
from governor.policy import values as v
from governor.record import replace

from .fakekernel import FakeKernelCgroupFs
from .plans import GROUP, make_plan

PAGE = 4096
FILE = 64 << 20  # the group's file cache


def _stat(refault_pages: int) -> str:
    return (
        f"anon {8 << 20}\nfile {FILE}\nkernel 0\nworkingset_refault_anon 0\n"
        f"workingset_refault_file {refault_pages}\nworkingset_activate_file 0\n"
    )


def _plan(*whens: str) -> Plan:
    watch = tuple(
        watch_rule(i, _watch_trigger(v.parse_condition(w)), ("log",), when=w)
        for i, w in enumerate(whens)
    )
    return replace(make_plan(), watch=watch)


def test_group_and_board_refault_rules_fire_on_their_share(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    plan = _plan("refaults > 50%/4s", "board refaults > 90%/4s")
    CgroupfsBackend(fake_fs).apply(plan)
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(
        "MemTotal: 2048000 kB\nMemAvailable: 1024000 kB\n"
        "Active(file): 65536 kB\nInactive(file): 65536 kB\n"
    )  # 128 MiB of file cache on the board
    now = [0.0]
    mon = Monitor(
        Env(fake_fs, plan, engine_pids=lambda: [1], board=Board(ProcFs(proc)), clock=lambda: now[0])
    )
    mon.start()
    refaults = board = 0
    for step in range(12):
        now[0] = float(step)
        # the group re-reads 16 MiB/s from t=3 on (counted at each sample); the board counts
        # the same pages, over its 128 MiB of file cache
        if step >= 3:
            refaults += (16 << 20) // PAGE
            board += (16 << 20) // PAGE
        (fake_fs.path(GROUP) / files.MEMORY_STAT).write_text(_stat(refaults))
        (proc / "vmstat").write_text(f"nr_free_pages 1\nworkingset_refault_file {board}\n")
        mon.dispatch()
    states = {r["rule"]: r for r in mon.rule_states()}
    out = mon.finish()
    fired = {r["rule"]: r["fired"] for r in out["rules"]}
    assert fired == {0: 1, 1: 0}  # one episode: fired once without a cooldown
    first = out["firings"][0]
    # t=4: 2 x 16 MiB since t=0 over 64 MiB = 50 %, not above; t=5: 3 x 16 MiB = 75 %
    assert first["rule"] == 0 and first["t_s"] == 5.0 and first["value"] == 75.0
    assert states[0]["refaults_pct"] == 100.0  # a whole window of it: 64 MiB over 64 MiB
    assert states[1]["refaults_pct"] == 50.0  # 64 MiB over the board's 128 MiB


def test_a_refault_rule_without_counters_never_fires(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    plan = _plan("refaults > 1%/2s")
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
    )
    mon.start()
    for step in range(5):
        now[0] = float(step)
        (fake_fs.path(GROUP) / files.MEMORY_STAT).write_text(f"anon 1\nfile {FILE}\n")
        mon.dispatch()
    assert [r["fired"] for r in mon.finish()["rules"]] == [0]
    assert mon.rule_states()[0]["refaults_pct"] is None
