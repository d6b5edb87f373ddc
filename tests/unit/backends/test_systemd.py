"""The systemd backend's lifecycle on a fake cgroup tree with a fake bus (no systemd needed):
the scope is started with the mapping table's properties, the job is waited for, the governor
moves itself to <unit>/supervisor BEFORE controllers are enabled in <unit> (no internal
processes), the deferred writes land on <unit>/engine, remove touches only the engine leaf;
D-Bus error mapping; sd_notify over a real datagram socket.

Needs: tests/fakefs/fakekernel.py (tmp tree), nothing else.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from fakefs.fakekernel import FakeKernelCgroupFs, make_root

from governor.backends import systemd as sd
from governor.backends.placement import Placement
from governor.compile import placements as pl
from governor.compile.compiler import compile_plan
from governor.errors import BackendError, HostError, PermissionDenied
from governor.kernel import files as kf
from governor.plan import unitmap
from governor.plan.host import probe
from governor.plan.model import Plan
from governor.policy.loader import load_text
from governor.supervise.sdnotify import notify

REPO = Path(__file__).resolve().parents[3]
HOST = REPO / "tests" / "fixtures" / "hosts" / "cgroup2-full"
PID = 4242
POLICY = """
name = "npu-chat"
[memory]
high = "200M"
max = "256M"
oom_group = true
[cpu]
cpus = "1"
[pids]
max = 64
"""


class MovingFs(FakeKernelCgroupFs):
    """The fake tree, plus what a write to cgroup.procs does in the kernel: a move."""

    def move(self, pid: int, cgroup: str) -> None:
        self.reap(pid)
        self.add_process(cgroup, pid)


class FakeBus:
    def __init__(self, fs: MovingFs, *, lands_in: str | None = None) -> None:
        self.fs = fs
        self.lands_in = lands_in
        self.started: list[tuple[str, list[sd.Prop]]] = []
        self.polls = 0

    def start_transient_unit(self, name: str, props: list[sd.Prop]) -> str:
        self.started.append((name, props))
        values = {n: v for n, _, v in props}
        cgroup = self.lands_in or f"{unitmap.slice_cgroup(values['Slice'])}/{name}"
        parts = cgroup.split("/")
        for i in range(len(parts)):  # systemd creates the path and enables what it needs
            parent = "/".join(parts[:i])
            self.fs.mkdir("/".join(parts[: i + 1]))
            missing = self.fs.controllers(parent) - self.fs.subtree_control(parent)
            self.fs.enable(parent, sorted(missing))
        for pid in values["PIDs"]:
            self.fs.move(pid, cgroup)
        return "/org/freedesktop/systemd1/job/7"

    def job_pending(self, job: str) -> bool:
        self.polls += 1
        return self.polls < 3

    def unit_property(self, unit: str, interface: bytes, prop: str) -> Any:
        name, props = self.started[-1]
        values = {n: v for n, _, v in props}
        cgroup = self.lands_in or f"{unitmap.slice_cgroup(values['Slice'])}/{name}"
        return {"ActiveState": "active", "ControlGroup": f"/{cgroup}"}[prop]

    def reload(self) -> None:
        pass


def _plan() -> Plan:
    return compile_plan(load_text(POLICY, source="t.toml"), probe(HOST))


def _backend(fs: MovingFs, bus: FakeBus, plan: Plan, **kw: Any) -> sd.SystemdBackend:
    placement = Placement("scope", unitmap.scope_unit(plan.policy), unitmap.scope_cgroup(plan))
    return sd.SystemdBackend(
        fs,
        placement=placement,
        full_plan=plan,
        systemd_version=252,
        bus_factory=lambda: bus,
        getpid=lambda: PID,
        sleep=lambda _s: None,
        **kw,
    )


def test_scope_apply_moves_the_governor_first_then_delegates(tmp_path: Path) -> None:
    fs = MovingFs(make_root(tmp_path / "cg"))
    plan = _plan()
    bus = FakeBus(fs)
    unit = unitmap.scope_cgroup(plan)
    delegated = pl.delegated_plan(plan, unit, 252)
    backend = _backend(fs, bus, plan)
    with backend.lock(delegated):
        backend.apply(delegated)
    (name, props), = bus.started  # fmt: skip
    assert name == "governor-npu\\x2dchat.scope"
    assert {n for n, _, _ in props} >= {"MemoryHigh", "MemoryMax", "TasksMax", "AllowedCPUs"}
    assert bus.polls == 3  # waited for the job
    assert fs.procs(f"{unit}/supervisor") == [PID]
    assert fs.procs(unit) == []
    assert set(plan.controllers) <= fs.subtree_control(unit)
    assert fs.read(f"{unit}/engine", kf.MEMORY_OOM_GROUP).strip() == "1"
    # limits are systemd's (on the scope), not written by the governor
    assert fs.read(f"{unit}/engine", kf.MEMORY_MAX).strip() == "max"
    fs.add_process(f"{unit}/engine", 99)
    removed = backend.remove(delegated)
    assert removed.killed
    assert not fs.exists(f"{unit}/engine")
    assert fs.exists(f"{unit}/supervisor")


def test_a_scope_in_an_unexpected_cgroup_is_an_error(tmp_path: Path) -> None:
    fs = MovingFs(make_root(tmp_path / "cg"))
    plan = _plan()
    bus = FakeBus(fs, lands_in="elsewhere.slice/governor-npu\\x2dchat.scope")
    backend = _backend(fs, bus, plan)
    with pytest.raises(BackendError, match="expected active in"):
        backend.apply(pl.delegated_plan(plan, unitmap.scope_cgroup(plan), 252))


def test_a_job_that_never_finishes_times_out(tmp_path: Path) -> None:
    fs = MovingFs(make_root(tmp_path / "cg"))
    plan = _plan()
    bus = FakeBus(fs)
    bus.job_pending = lambda job: True  # type: ignore[method-assign]
    now = [0.0]

    def clock() -> float:
        now[0] += 10
        return now[0]

    backend = _backend(fs, bus, plan, clock=clock, job_timeout_s=30)
    with pytest.raises(BackendError, match="did not finish in 30s"):
        backend.apply(pl.delegated_plan(plan, unitmap.scope_cgroup(plan), 252))


class _DBusError(Exception):
    def __init__(self, name: str, message: str, errno: int) -> None:
        super().__init__(message)
        self.err_name = name
        self.err_message = message
        self.errno = errno


def test_dbus_errors_map_to_governor_errors() -> None:
    exists = sd._bus_error(
        _DBusError("org.freedesktop.systemd1.UnitExists", "Unit x.scope already exists.", -17),
        "cannot start transient unit x.scope",
    )
    assert isinstance(exists, HostError)
    assert exists.exit_code == 69
    denied = sd._bus_error(
        _DBusError("org.freedesktop.DBus.Error.AccessDenied", "Access denied", -13), "start"
    )
    assert isinstance(denied, PermissionDenied)
    assert denied.errno == 13
    other = sd._bus_error(_DBusError("org.freedesktop.DBus.Error.Failed", "boom", -5), "start")
    assert isinstance(other, BackendError)
    assert other.exit_code == 71


@pytest.mark.parametrize("abstract", [False, True])
def test_sd_notify_sends_one_datagram(tmp_path: Path, abstract: bool) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        if abstract:
            name = f"governor-test-{tmp_path.name}"
            server.bind("\0" + name)
            address = "@" + name
        else:
            address = str(tmp_path / "notify")
            server.bind(address)
        assert notify("READY=1\nSTATUS=up", env={"NOTIFY_SOCKET": address})
        assert server.recv(4096) == b"READY=1\nSTATUS=up"


def test_sd_notify_without_a_socket_does_nothing() -> None:
    assert not notify("READY=1", env={})
    assert not notify("READY=1", env={"NOTIFY_SOCKET": "vsock:2:1"})


def test_scope_apply_raises_the_slice_protection_through_the_manager(tmp_path: Path) -> None:
    fs = MovingFs(make_root(tmp_path / "cg"))
    plan = compile_plan(
        load_text(POLICY.replace('high = "200M"', 'min = "64M"\nhigh = "200M"'), source="t.toml"),
        probe(HOST),
    )
    assert plan.protect_parents == (kf.MEMORY_MIN,)
    # a sibling already protected in governor.slice: the slice must grant both
    fs.enable("", ["memory"])
    fs.mkdir("governor.slice")
    fs.enable("governor.slice", ["memory"])
    fs.mkdir("governor.slice/other.slice")
    fs.write("governor.slice/other.slice", kf.MEMORY_MIN, str(16 << 20))
    calls: list[tuple[str, str]] = []

    class ScopeBus(FakeBus):
        def start_transient_unit(self, name: str, props: list[sd.Prop]) -> str:
            job = super().start_transient_unit(name, props)
            mem_min = next(v for n, _, v in props if n == "MemoryMin")
            fs.write(unitmap.scope_cgroup(plan), kf.MEMORY_MIN, str(mem_min))
            return job

    def set_property(unit: str, assignment: str) -> None:
        calls.append((unit, assignment))
        fs.write(unitmap.slice_cgroup(unit), kf.MEMORY_MIN, assignment.split("=")[1])

    unit = unitmap.scope_cgroup(plan)
    delegated = pl.delegated_plan(plan, unit, 252)
    backend = _backend(fs, ScopeBus(fs), plan, set_property=set_property)
    backend.apply(delegated)
    assert calls == [("governor.slice", f"MemoryMin={(64 + 16) << 20}")]
    # applied again (a second launch): already enough, the manager is not asked
    backend.apply(delegated)
    assert len(calls) == 1


def test_no_protection_in_the_policy_never_touches_the_slice(tmp_path: Path) -> None:
    fs = MovingFs(make_root(tmp_path / "cg"))
    plan = _plan()
    calls: list[tuple[str, str]] = []
    unit = unitmap.scope_cgroup(plan)
    backend = _backend(fs, FakeBus(fs), plan, set_property=lambda u, a: calls.append((u, a)))
    backend.apply(pl.delegated_plan(plan, unit, 252))
    assert calls == []
