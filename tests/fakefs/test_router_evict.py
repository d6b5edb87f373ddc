"""Issue 38 item 3 and the router's publication on a fake cgroup tree: each model's last
request sampled and published at most once a second (RunState.router), and
``[engine] evict = "memory"``: a new child that would not fit waits frozen in its leaf while
the least recently used idle models are unloaded. The real router: tests/kernel/
test_router_guest.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from governor.kernel import files as kf
from governor.rundir.state import RunState, check_state
from governor.supervise.models import PUBLISH_S, SAMPLE_S, ModelLeaves, ModelLimits
from governor.supervise.router import Activity

from .fakekernel import FakeKernelCgroupFs

MIB = 1 << 20
GROUP = "governor.slice/r"
LEAF = f"{GROUP}/engine"
ROUTER = b"/opt/llama/bin/llama-server\0--models-dir\0/m\0-c\0256\0"


def _child(alias: str) -> bytes:
    return b"/opt/llama/bin/llama-server\0--alias\0" + alias.encode() + b"\0--model\0/m/x.gguf\0"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class MovingFs(FakeKernelCgroupFs):
    """cgroup.procs moves the process; every write recorded in order."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: list[tuple[str, str, str]] = []

    def write(self, cgroup: str, file: str, value: str) -> None:
        self.writes.append((cgroup, file, value))
        super().write(cgroup, file, value)

    def move(self, pid: int, cgroup: str) -> None:
        self.writes.append((cgroup, kf.CGROUP_PROCS, str(pid)))
        self.reap(pid)
        self.add_process(cgroup, pid)


@pytest.fixture
def tree(cgroup_root: Path, tmp_path: Path) -> tuple[MovingFs, Path]:
    fs = MovingFs(cgroup_root)
    fs.enable("", ["memory", "cpu"])
    fs.mkdir("governor.slice")
    fs.enable("governor.slice", ["memory", "cpu"])
    fs.mkdir(GROUP)
    fs.mkdir(LEAF)
    proc = tmp_path / "proc"
    _spawn(fs, proc, 100, ROUTER)
    return fs, proc


def _spawn(fs: MovingFs, proc: Path, pid: int, cmdline: bytes) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cmdline").write_bytes(cmdline)
    fs.add_process(LEAF, pid)


def _usage(fs: MovingFs, alias: str, usec: int) -> None:
    path = fs.root / GROUP / "models" / alias / kf.CPU_STAT
    path.write_text(f"usage_usec {usec}\nuser_usec {usec}\nsystem_usec 0\n")


def test_placement_and_activity_are_published_at_most_once_per_interval(
    tree: tuple[MovingFs, Path],
) -> None:
    fs, proc = tree
    mono, wall = Clock(), Clock(1_700_000_000.0)
    published: list[dict[str, Any]] = []
    leaves: ModelLeaves
    leaves = ModelLeaves(
        fs, group=GROUP, leaf=LEAF, limits={"a": ModelLimits(), "b": ModelLimits()},
        router_pid=lambda: 100, proc_root=proc, activity=Activity(fs, GROUP, clock=wall),
        on_change=lambda: published.append(leaves.published()), clock=mono,
    )  # fmt: skip
    assert leaves.tick() is False  # nothing happened: nothing rewritten
    _spawn(fs, proc, 101, _child("a"))
    leaves.poll()
    _usage(fs, "a", 0)
    mono.now += SAMPLE_S
    assert leaves.tick() is True  # the placement dates a's load; a's usage sampled
    assert published[-1]["models"] == {
        "a": {"last_request": 1_700_000_000.0}, "b": {"last_request": None}
    }  # fmt: skip
    # a's leaf uses CPU (a request) within the interval: sampled, but not published yet
    wall.now += 5
    mono.now += SAMPLE_S
    _usage(fs, "a", 50_000)
    assert leaves.tick() is False
    assert len(published) == 1
    mono.now += PUBLISH_S - SAMPLE_S
    assert leaves.tick() is True
    assert published[-1]["models"]["a"] == {"last_request": 1_700_000_005.0}
    # an idle leaf (no CPU) moves nothing: no republication however long it idles
    for _ in range(5):
        mono.now += PUBLISH_S
        assert leaves.tick() is False
    leaves.count_unload("a", "memory")
    leaves.count_unload("a", "memory")
    assert leaves.tick() is True
    assert published[-1]["unloads"] == [{"model": "a", "reason": "memory", "count": 2}]


def test_the_router_state_round_trips_and_check_state_takes_it() -> None:
    router = {
        "url": "http://127.0.0.1:8080",
        "models": {"a": {"last_request": 1_700_000_000.5}, "b": {"last_request": None}},
        "unloads": [{"model": "a", "reason": "memory", "count": 1}],
    }
    state = RunState(
        policy="r", source="launch", policy_path=None, pid=1, started_at=1.0,
        backend="cgroupfs", cgroup_root="/sys/fs/cgroup", group=GROUP, leaf=LEAF,
        plan={}, router=router,
    )  # fmt: skip
    data = state.to_json()
    assert data["router"] == router
    assert RunState.read(data).router == router
    bad = {**router, "unloads": [{"model": "a", "reason": "memory", "count": "1"}]}
    assert check_state({**data, "format": 1, "router": bad}) is not None


def test_a_router_launch_publishes_its_base_url_from_host_and_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from governor.api.launch import router_url

    monkeypatch.delenv("LLAMA_ARG_HOST", raising=False)
    monkeypatch.setenv("LLAMA_ARG_PORT", "9000")
    argv = ("llama-server", "--models-dir", "/m", "--host", "0.0.0.0")
    assert router_url({"router": {"a": 1}}, argv) == "http://127.0.0.1:9000"
    assert router_url({"router": {}}, (*argv, "--port", "41233")) == "http://127.0.0.1:41233"
    assert router_url({"model": "x.gguf", "total": 1}, argv) is None  # no router
    assert router_url(None, argv) is None
