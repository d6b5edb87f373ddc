"""The shed against hostile input on the real kernel (issue 35, items 1, 3, 8, 15), in the guest
with the memory controller on: the shedder (governor/monitor/actions/shedder.py) runs in this process on
real cgroups below a scratch slice, its victims' published states and the board file written
as another process (or a careless operator) would; its clock is a list (the settle time and
the stop grace pass without waiting; nothing asserts on time).

- A board entry that is or contains a governed slice is skipped (shed.board_invalid): the
  governed job's own `yield = ["freeze"]` wins, it is frozen, never killed; a valid entry
  beside it is throttled.
- An unknown class in another slice's state and an unknown yield step are skipped, logged:
  no crash, no kill; the known step is taken.
- A step the kernel refuses (memory.high absent: the memory controller is off for that
  group) is not retried: the freeze follows in the same firing.
- `stop` delivers a real SIGTERM to every process of a board cgroup, `kill` after the grace
  writes cgroup.kill and the group empties; a governed victim's published engine pid is
  signalled only while it is in its group.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from fakefs.plans import make_plan
from helpers import cgroups
from helpers.cgroups import ScratchSlice, Spawn

from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.log import capture_logs
from governor.monitor.actions.base import Context
from governor.monitor.actions.shedder import STOP_GRACE_S, Shedder
from governor.plan.model import Plan, QosSpec
from governor.record import replace
from governor.rundir.journal import Journal
from governor.rundir.state import Publisher, applied

CTX = Context(rule=0, when="board available < 1M")
KERNEL = pytest.mark.kernel(controllers=("memory",), root=True)


class Rig:
    """A scratch slice with memory on, a run dir, a board file and the shedder's clock."""

    def __init__(self, scratch: ScratchSlice, tmp_path: Path) -> None:
        self.scratch, self.root = scratch, scratch.root
        cgroups.write(self.root / "cgroup.subtree_control", "+memory")
        scratch.create()
        cgroups.write(scratch.path / "cgroup.subtree_control", "+memory")
        self.run, self.board = tmp_path / "run", tmp_path / "board.toml"
        self.run.mkdir()
        self.now = [1000.0]

    def rel(self, cg: Path) -> str:
        return str(cg.relative_to(self.root))

    def plan(self, name: str, qos: QosSpec, group: Path) -> Plan:
        g = self.rel(group)
        plan = make_plan(policy=name, group=g, leaf=g, writes=())
        return replace(plan, cgroup_root=str(self.root), slice=self.scratch.name, qos=qos)

    def publish(
        self, plan: Plan, engine_pid: int | None = None, *, launched: bool = False, **qos: Any
    ) -> None:
        """``plan`` published as `apply` leaves it (its claim stays after a stop: never
        stopped, issue 44), or ``launched``: as a running launch (this process its governor)."""
        Publisher(self.run, plan.policy).publish(
            applied(plan, policy_path=None, created=[], started_at=1.0)
        )
        path = self.run / plan.policy / "state.json"
        state = json.loads(path.read_text())  # as another process may have written it
        state["plan"]["qos"].update(qos)
        state["engine_pid"] = engine_pid
        if launched:
            state.update(
                source="launch", pid=os.getpid(), pid_start=ProcFs().starttime(os.getpid())
            )
            state.pop("created", None)
        path.write_text(json.dumps(state))

    def shedder(self, **kw: Any) -> Shedder:
        chat = self.plan("chat", QosSpec(qos_class="interactive"), self.scratch.child("chat"))
        return Shedder(CgroupFs(self.root), chat, run=self.run, board=self.board,
                       clock=lambda: self.now[0], **kw)  # fmt: skip

    def fire(self, sh: Shedder, times: int, tick: float = 4.0) -> list[tuple[str, str]]:
        """The rule fires ``times`` times, ``tick`` s apart: (victim, step) of each step."""
        out = []
        for _ in range(times):
            res = sh.shed(CTX)
            if res.ok and res.after:  # a failed step says which it was too
                out.append((res.after["victim"], res.after["step"]))
            self.now[0] += tick
        return out


def _trapper(mark: Path) -> list[str]:
    """A process that writes ``mark`` on SIGTERM and lives on (SIGKILL ends it); it writes
    ``mark``.ready once its handler is in place (a shell's trap would not do: a signal
    ignored when a shell starts cannot be trapped, POSIX `trap`)."""
    return ["/usr/bin/python3", "-c", (
        "import pathlib, signal, time\n"
        f"mark = pathlib.Path({str(mark)!r})\n"
        "signal.signal(signal.SIGTERM, lambda *_: mark.write_text('term'))\n"
        "mark.with_suffix('.ready').write_text('1')\n"
        "while True:\n    time.sleep(0.2)\n"
    )]  # fmt: skip


def _ready(*marks: Path) -> None:
    for mark in marks:
        cgroups.wait_for(mark.with_suffix(".ready").exists, 60, f"{mark.stem} started")


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


@KERNEL
def test_a_board_entry_on_a_governed_slice_is_skipped_its_own_yield_wins(
    tmp_path: Path, scratch_slice: ScratchSlice, spawn: Spawn
) -> None:
    rig = Rig(scratch_slice, tmp_path)
    job, cam = scratch_slice.child("job"), scratch_slice.child("cam")
    worker = spawn(["sleep", "600"], cgroup=job)
    camera = spawn(["sleep", "600"], cgroup=cam)
    rig.publish(rig.plan("job", QosSpec(qos_class="background", yields=("freeze",)), job))
    rig.board.write_text(
        f'[[cgroup]]\npath = "{rig.rel(job)}"\nclass = "background"\nyield = ["kill"]\n'
        f'name = "job-too"\n'
        f'[[cgroup]]\npath = "{scratch_slice.name}"\nclass = "background"\nname = "all"\n'
        f'[[cgroup]]\npath = "{rig.rel(cam)}"\nclass = "background"\nyield = ["throttle"]\n'
    )
    sh = rig.shedder()
    with capture_logs() as logs:
        steps = rig.fire(sh, 6)
    assert sorted(steps) == [("cam", "throttle"), ("job", "freeze")], steps
    assert cgroups.read_kv(job / "cgroup.events")["frozen"] == 1
    assert cgroups.read(cam / "memory.high") != "max"
    assert worker.poll() is None and camera.poll() is None  # nothing killed
    bad = _events(logs, "shed.board_invalid")
    assert sorted(e["victim"] for e in bad) == ["cgroup[0].path", "cgroup[1].path"], bad
    assert not (rig.run / "board" / "job-too").exists()
    assert [e["step"] for e in Journal(rig.run / "job").entries()] == ["freeze"]
    sh.release_all("monitor stopped")
    assert cgroups.read_kv(job / "cgroup.events")["frozen"] == 0
    assert cgroups.read(cam / "memory.high") == "max"


@KERNEL
def test_an_unknown_class_or_step_in_a_published_state_is_skipped_never_a_kill(
    tmp_path: Path, scratch_slice: ScratchSlice, spawn: Spawn
) -> None:
    rig = Rig(scratch_slice, tmp_path)
    odd, job = scratch_slice.child("odd"), scratch_slice.child("job")
    procs = [spawn(["sleep", "600"], cgroup=odd), spawn(["sleep", "600"], cgroup=job)]
    rig.publish(rig.plan("odd", QosSpec(), odd), qos_class="platinum")
    rig.publish(rig.plan("job", QosSpec(), job), yields=["obliterate", "throttle", "nap"])
    sh = rig.shedder()
    with capture_logs() as logs:
        steps = rig.fire(sh, 4)
    assert steps == [("job", "throttle")], steps
    assert all(p.poll() is None for p in procs)
    assert cgroups.read(odd / "memory.high") == "max"
    assert cgroups.read_kv(odd / "cgroup.events")["frozen"] == 0
    said = sorted(e["victim"] for e in _events(logs, "shed.victim_invalid"))
    assert said == ["job", "odd"], said


@KERNEL
def test_a_step_the_kernel_refuses_is_not_retried_the_next_one_follows(
    tmp_path: Path, scratch_slice: ScratchSlice, spawn: Spawn
) -> None:
    rig = Rig(scratch_slice, tmp_path)
    plain = scratch_slice.child("plain")  # no +memory in its subtree_control
    nomem, other = plain / "job", scratch_slice.child("other")
    nomem.mkdir()
    assert not (nomem / "memory.high").exists()
    procs = [spawn(["sleep", "600"], cgroup=nomem), spawn(["sleep", "600"], cgroup=other)]
    bg = QosSpec(qos_class="background", yields=("throttle", "freeze"))
    rig.publish(rig.plan("nomem", bg, nomem))
    rig.publish(rig.plan("other", QosSpec(qos_class="background", yields=("throttle",)), other))
    sh = rig.shedder()
    with capture_logs() as logs:
        steps = rig.fire(sh, 5)
    assert sorted(steps) == [("nomem", "freeze"), ("other", "throttle")], steps
    failed = _events(logs, "shed.step_failed")
    assert [(e["victim"], e["step"]) for e in failed] == [("nomem", "throttle")], failed
    assert cgroups.read_kv(nomem / "cgroup.events")["frozen"] == 1
    assert all(p.poll() is None for p in procs)
    sh.release_all("monitor stopped")
    assert cgroups.read_kv(nomem / "cgroup.events")["frozen"] == 0


@KERNEL
def test_stop_sends_a_real_sigterm_and_kill_empties_the_board_cgroup(
    tmp_path: Path, scratch_slice: ScratchSlice, spawn: Spawn
) -> None:
    rig = Rig(scratch_slice, tmp_path)
    cam, mark = scratch_slice.child("cam"), tmp_path / "cam.term"
    recorder = spawn(_trapper(mark), cgroup=cam)
    rig.board.write_text(
        f'[[cgroup]]\npath = "{rig.rel(cam)}"\nclass = "background"\nyield = ["stop", "kill"]\n'
    )
    _ready(mark)
    sh = rig.shedder()
    assert rig.fire(sh, 1) == [("cam", "stop")]
    cgroups.wait_for(mark.exists, 30, "the SIGTERM trapped by the recorder")
    assert recorder.poll() is None  # it trapped the SIGTERM: stopped is not killed
    assert rig.fire(sh, 1) == []  # the grace after stop
    rig.now[0] += STOP_GRACE_S
    assert rig.fire(sh, 1) == [("cam", "kill")]
    cgroups.wait_for(lambda: not cgroups.populated(cam), 30, "the board cgroup emptied")
    assert recorder.wait(timeout=30) == -signal.SIGKILL
    assert [e["step"] for e in Journal(rig.run / "board" / "cam").entries()] == ["stop", "kill"]


@KERNEL
def test_stop_signals_the_governed_engine_pid_in_its_group_and_nobody_else(
    tmp_path: Path, scratch_slice: ScratchSlice, spawn: Spawn
) -> None:
    """A real SIGTERM reaches the victim's published engine (in its group), not the helper
    beside it nor a process outside. A stale or forged pid (not in the group) is never
    signalled: tests/fakefs/test_shed.py (the group's own processes get the SIGTERM then)."""
    rig = Rig(scratch_slice, tmp_path)
    job = scratch_slice.child("job")
    engine = spawn(_trapper(tmp_path / "engine.term"), cgroup=job)
    helper = spawn(_trapper(tmp_path / "helper.term"), cgroup=job)
    outsider = spawn(_trapper(tmp_path / "outsider.term"))
    _ready(*(tmp_path / f"{n}.term" for n in ("engine", "helper", "outsider")))
    plan = rig.plan("job", QosSpec(qos_class="background", yields=("stop",)), job)
    sent: list[int] = []

    def kill(pid: int, sig: int) -> None:
        sent.append(pid)
        os.kill(pid, sig)

    rig.publish(plan, engine_pid=engine.pid, launched=True)
    assert rig.fire(rig.shedder(kill=kill), 1) == [("job", "stop")]
    cgroups.wait_for((tmp_path / "engine.term").exists, 30, "the engine's SIGTERM")
    assert sent == [engine.pid]  # the engine only, not the helper beside it
    for p in (engine, helper, outsider):
        assert p.poll() is None
    assert not (tmp_path / "outsider.term").exists()
