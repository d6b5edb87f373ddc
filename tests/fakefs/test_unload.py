"""Unload before freeze (issue 38 item 4): the verb `unload` and the shed ladder's first step
"unload" on a router victim, against a tiny HTTP server that answers as llama-server's router
does (GET /models, GET /slots?model=&autoload=false, POST /models/unload), on a fake cgroup
tree. The least recently used idle model goes first, a busy one never; with none idle (or no
router) the ladder goes on to throttle at the same firing and a rule's later actions run."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from helpers.peers import StandIn, trickle

from governor.backends.cgroupfs import CgroupfsBackend
from governor.board.file import load_board
from governor.compile.compiler import compile_plan, watch_rule
from governor.errors import PolicyError
from governor.kernel import files
from governor.kernel.procfs import ProcFs
from governor.monitor.actions.base import Context, Env
from governor.monitor.actions.unload import UNLOAD_S, Unload, merge_unloads
from governor.monitor.loop import Monitor
from governor.monitor.sources import Board as Readings
from governor.plan.host import probe
from governor.plan.model import Plan, QosSpec, WatchCondition
from governor.policy.loader import load_text
from governor.policy.values import parse_action
from governor.record import replace
from governor.rundir.journal import Journal
from governor.rundir.state import Publisher, RunState, applied

from .fakekernel import FakeKernelCgroupFs
from .plans import GROUP, make_plan
from .test_shed import CHAT, MIB, Board, _plan

CTX = Context(rule=0, when="board memory some 100ms/1s")
HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
ROUTER = QosSpec(qos_class="background")  # the default yield: unload first


class FakeRouter:
    """What the governor reads of llama-server's router: each model's status, which one has a
    slot processing, and the unloads it was asked for."""

    def __init__(self, models: dict[str, str], busy: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.models = dict(models)
        self.busy = set(busy)
        self.unloaded: list[str] = []
        self.calls: list[str] = []
        router = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                router.calls.append(f"GET {self.path}")
                if parts.path == "/models":
                    items = [{"id": m, "status": {"value": s}} for m, s in router.models.items()]
                    self._answer(200, {"data": items})
                elif parts.path == "/slots":
                    query = parse_qs(parts.query)
                    model = query["model"][0]
                    assert query["autoload"] == ["false"]  # never loads a model to look
                    if router.models.get(model) not in ("loaded", "sleeping"):
                        self._answer(400, {"error": "model not loaded"})
                    else:
                        self._answer(200, [{"id": 0, "is_processing": model in router.busy}])
                else:
                    self._answer(404, {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                router.calls.append(f"POST {self.path} {body['model']}")
                router.unloaded.append(body["model"])
                router.models[body["model"]] = "unloaded"
                self._answer(200, {"success": True})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def board(fake_fs: FakeKernelCgroupFs, tmp_path: Path) -> Board:
    return Board(fake_fs, tmp_path / "run")


@pytest.fixture
def router() -> Iterator[FakeRouter]:
    # a last used longest ago, c busy, b idle and used recently, u not loaded
    r = FakeRouter({"a": "loaded", "b": "loaded", "c": "loaded", "u": "unloaded"}, busy={"c"})
    yield r
    r.close()


LAST = {"a": 100.0, "b": 200.0, "c": 50.0, "u": None}


@pytest.fixture(scope="module")
def launch_pid() -> Iterator[int]:
    """A live process whose command line says governor: the launch a published state names
    (a state whose pid is gone is stale: no victim)."""
    proc = subprocess.Popen(["governor-launch", "600"], executable="/bin/sleep")
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    for _ in range(1000):  # Popen returns while the exec is still under way
        if b"governor" in cmdline.read_bytes():
            break
        time.sleep(0.001)
    yield proc.pid
    proc.kill()
    proc.wait()


def _router_state(plan: Plan, url: str, pid: int, last: dict[str, float | None] = LAST) -> RunState:
    """A launch's state of a router slice (only a launch publishes ``router``)."""
    st = applied(plan, policy_path=None, created=[], started_at=1.0)
    models = {a: {"last_request": t} for a, t in last.items()}
    return replace(
        st, source="launch", pid=pid, router={"url": url, "models": models, "unloads": []}
    )


def _publish_router(board: Board, plan: Plan, url: str, pid: int, usage: int = 700 * MIB) -> Plan:
    plan = board.publish(plan, usage)
    Publisher(board.run, plan.policy).publish(_router_state(plan, url, pid))
    return plan


def _entries(board: Board, name: str) -> list[tuple[str, str | None]]:
    return [(e["step"], e.get("model")) for e in Journal(board.run / name).entries()]


# ---------------------------------------------------------------- the verb


def test_the_verb_parses_without_an_argument() -> None:
    assert str(parse_action("unload")) == "unload"
    with pytest.raises(ValueError, match="takes no argument"):
        parse_action("unload tiny")


def test_the_verb_unloads_the_least_recently_used_idle_model_and_then_lets_the_rule_go_on(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, launch_pid: int
) -> None:
    run = tmp_path / "run"
    oom = WatchCondition(condition="event", event="oom_kill", file="memory.events")
    plan = replace(make_plan(), watch=(watch_rule(0, oom, ("unload", "log"), cooldown_s=0.0),))
    CgroupfsBackend(fake_fs).apply(plan)
    Publisher(run, plan.policy).publish(_router_state(plan, router.url, launch_pid))
    now = [0.0]
    mon = Monitor(
        Env(
            fake_fs,
            plan,
            engine_pids=lambda: [1],
            board=Readings(ProcFs(tmp_path)),
            clock=lambda: now[0],
            journal=Journal(run / plan.policy),
        )
    ).start()
    fired = []
    for n in (1, 2, 3):  # three firings: a (LRU idle), b, then none idle (c is busy)
        now[0] = float(n)
        (fake_fs.path(GROUP) / files.MEMORY_EVENTS).write_text(f"max {n}\noom {n}\noom_kill {n}\n")
        mon.dispatch()
        fired.append(mon.recent[-1]["actions"])
    assert router.unloaded == ["a", "b"]  # never c (a request in flight), never u
    assert [[a["action"] for a in f] for f in fired] == [["unload", "log"]] * 3
    assert fired[0][0]["ok"] and fired[0][0]["after"]["model"] == "a"
    assert not fired[2][0]["ok"] and "no idle model to unload" in fired[2][0]["detail"]
    entries = Journal(run / plan.policy).entries()
    assert [(e["source"], e["model"], e["reason"]) for e in entries] == [
        ("unload", "a", "pressure"),
        ("unload", "b", "pressure"),
    ]
    assert mon.totals()["router_unloads"] == [
        {"model": "a", "reason": "pressure", "count": 1},
        {"model": "b", "reason": "pressure", "count": 1},
    ]
    mon.finish()


def test_the_verb_on_a_slice_that_is_no_router_fails_with_why(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    plan = make_plan()
    run = tmp_path / "run"
    Publisher(run, plan.policy).publish(applied(plan, policy_path=None, created=[], started_at=1.0))
    handler = Unload(Env(fake_fs, plan, lambda: [], journal=Journal(run / plan.policy)))
    res = handler.run(parse_action("unload"), CTX)  # type: ignore[arg-type]
    assert not res.ok and res.detail is not None and "not a router" in res.detail
    assert handler.totals() == {"router_unloads": []}


def test_unload_counts_merge_into_the_routers_published_unloads() -> None:
    evict = [{"model": "a", "reason": "memory", "count": 2}]
    pressure = [
        {"model": "a", "reason": "pressure", "count": 1},
        {"model": "b", "reason": "pressure", "count": 3},
    ]
    assert merge_unloads(evict, pressure, [{"model": "b", "reason": "pressure", "count": 1}]) == [
        {"model": "a", "reason": "memory", "count": 2},
        {"model": "a", "reason": "pressure", "count": 1},
        {"model": "b", "reason": "pressure", "count": 4},
    ]


# ---------------------------------------------------------------- the shed ladder


def test_a_router_victim_is_unloaded_first_while_idle_then_throttled(
    board: Board, router: FakeRouter, launch_pid: int
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    batch = _publish_router(board, _plan("batch", ROUTER, high=1 << 30), router.url, launch_pid)
    sh = board.shedder(chat)
    res = sh.shed(CTX)
    assert res.ok and (res.after["step"], res.after["model"]) == ("unload", "a")
    assert board.fs.read(batch.group, files.MEMORY_HIGH).strip() == str(1 << 30)  # untouched
    assert board.fs.read(batch.group, files.CGROUP_FREEZE).strip() == "0"
    assert sh.shed(CTX).detail == "settling after the previous step"
    board.tick()
    assert (sh.shed(CTX).after["step"], router.unloaded) == ("unload", ["a", "b"])
    board.tick()
    res = sh.shed(CTX)  # nothing idle (c is busy): the ladder goes on at the same firing
    assert res.ok and res.after["step"] == "throttle"
    assert board.fs.read(batch.group, files.MEMORY_HIGH).strip() == str(700 * MIB)
    assert router.unloaded == ["a", "b"]
    assert _entries(board, "batch") == [("unload", "a"), ("unload", "b"), ("throttle", None)]
    assert sh.totals_list() == [
        {"victim": "batch", "step": "throttle", "count": 1},
        {"victim": "batch", "step": "unload", "count": 2},
    ]
    held = Journal(board.run / "batch").shed()
    assert held is not None and held.state == "throttled" and held.unloads == 2


def test_an_unload_holds_nothing_and_its_undo_is_only_the_release(
    board: Board, router: FakeRouter, launch_pid: int
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    _publish_router(board, _plan("batch", ROUTER), router.url, launch_pid)
    sh = board.shedder(chat)
    assert sh.shed(CTX).after["step"] == "unload"
    held = Journal(board.run / "batch").shed()
    assert held is not None and held.state == "unloaded" and not held.frozen
    assert board.reverts[-1] == []  # the watchdog has nothing to revert
    board.tick()
    done = sh.undo()
    assert done is not None and done.after["step"] == "release"
    assert not sh.holding() and Journal(board.run / "batch").shed() is None
    assert router.unloaded == ["a"]  # the model reloads at its next request, not at the undo


@pytest.mark.parametrize("case", ["no router", "not in yield", "router down"])
def test_without_an_idle_model_to_take_the_first_step_is_throttle(
    board: Board,
    router: FakeRouter,
    case: str,
    launch_pid: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
    if case == "no router":
        board.publish(_plan("batch", ROUTER), 700 * MIB)
    elif case == "not in yield":
        qos = QosSpec(qos_class="background", yields=("throttle", "freeze"))
        _publish_router(board, _plan("batch", qos), router.url, launch_pid)
    else:
        dead = FakeRouter({})
        dead.close()  # its port answers nothing now
        _publish_router(board, _plan("batch", ROUTER), dead.url, launch_pid)
    res = board.shedder(chat).shed(CTX)
    assert res.ok and res.after["step"] == "throttle"
    assert router.unloaded == [] and router.calls == []
    # a slice that is no router passes over the step; a router down is a failed step
    assert ("shed.step_failed" in capsys.readouterr().err) is (case == "router down")


def test_a_trickling_victim_router_costs_the_shed_its_bound_and_the_ladder_throttles(
    board: Board, launch_pid: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 43 item 1: the unload step runs in the higher class's monitor thread; a victim
    router that trickles its answers (a byte per 0.2 s: no per-read timeout ever fires) fails
    the step within UNLOAD_S, and the same firing throttles the victim."""
    slow = StandIn(trickle(b'HTTP/1.0 200 OK\r\n\r\n{"data": []}', interval_s=0.2))
    try:
        chat = board.publish(_plan("npu-chat", CHAT), 600 * MIB)
        batch = _publish_router(board, _plan("batch", ROUTER), slow.url, launch_pid)
        t0 = time.monotonic()
        res = board.shedder(chat).shed(CTX)  # the default client: bounded_router
        took = time.monotonic() - t0
    finally:
        slow.close()
    assert took < UNLOAD_S + 5  # did not hang (the unbounded client: 20 s and more)
    assert res.ok and res.after["step"] == "throttle"
    assert board.fs.read(batch.group, files.MEMORY_HIGH).strip() == str(700 * MIB)
    assert _entries(board, "batch") == [("throttle", None)]
    said = capsys.readouterr()
    err = said.out + said.err
    assert "shed.step_failed" in err and f"no whole answer within {UNLOAD_S:g}s" in err


# ---------------------------------------------------------------- yield validation


def _compile(text: str) -> Plan:
    policy = load_text(text, source="test.toml")
    return compile_plan(policy, probe(HOSTS / "rk3588", target=f"governor.slice/{policy.name}"),
                        source="test.toml")  # fmt: skip


def test_yield_may_name_unload_and_the_default_starts_with_it() -> None:
    assert _compile('name = "r"\n[qos]\nclass = "background"\n').qos.yields[0] == "unload"
    plan = _compile('name = "r"\n[qos]\nclass = "background"\nyield = ["freeze", "unload"]\n')
    assert plan.qos.yields == ("unload", "freeze")  # the ladder's order
    plan = _compile('name = "r"\n[qos]\nclass = "background"\nyield = ["throttle"]\n')
    assert "unload" not in plan.qos.yields
    with pytest.raises(PolicyError) as err:
        load_text('name = "x"\n[qos]\nyield = ["unload", "unload"]\n')
    assert err.value.field == "qos.yield"
    plan = _compile('name = "r"\n[[pressure]]\nwhen = "memory some 150ms/2s"\ndo = ["unload"]\n')
    assert [a.verb for a in plan.watch[0].actions] == ["unload"]


def test_a_board_files_cgroup_cannot_yield_unload(tmp_path: Path) -> None:
    """An ungoverned cgroup is no router the governor knows: its yield has the four steps."""
    path = tmp_path / "board.toml"
    path.write_text('[[cgroup]]\npath = "a"\nyield = ["unload", "throttle"]\n')
    with pytest.raises(PolicyError) as err:
        load_board(path)
    assert err.value.field == "cgroup[0].yield"
    path.write_text('[[cgroup]]\npath = "a"\n')
    assert load_board(path)[0].yields == ("throttle", "freeze", "stop", "kill")


def test_the_launch_publishes_the_verbs_unloads_beside_its_evictions() -> None:
    """supervise/models.py router_state: RunState.router.unloads = the leaves' (evict =
    "memory") plus the monitor's `unload` handler's (the metric governor_model_unloads_total)."""
    from types import SimpleNamespace

    from governor.supervise.models import router_state

    leaves = SimpleNamespace(
        published=lambda: {
            "models": {"a": {"last_request": 5.0}},
            "unloads": [{"model": "a", "reason": "memory", "count": 1}],
        }
    )
    pressure = [{"model": "a", "reason": "pressure", "count": 2}]
    monitor = SimpleNamespace(totals=lambda: {"router_unloads": pressure, "shed_totals": []})
    url = "http://127.0.0.1:8080"
    state = router_state(url, leaves, monitor.totals())  # type: ignore[arg-type]
    assert state == {
        "url": "http://127.0.0.1:8080",
        "models": {"a": {"last_request": 5.0}},
        "unloads": [
            {"model": "a", "reason": "memory", "count": 1},
            {"model": "a", "reason": "pressure", "count": 2},
        ],
    }
    assert router_state(url, None, {}) == {"url": url, "models": {}, "unloads": []}
    assert router_state(None, leaves, {}) is None  # type: ignore[arg-type]  # no router


def test_an_attached_monitor_finds_the_launched_router_of_its_group(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, router: FakeRouter, launch_pid: int
) -> None:
    """`governor monitor` on the group a launch runs the router in: no router in its own
    state, the live launch's state of the same group has it."""
    plan = make_plan()
    run = tmp_path / "run"
    launched = replace(plan, policy="router-launch")
    Publisher(run, launched.policy).publish(_router_state(launched, router.url, launch_pid))
    elsewhere = replace(plan, policy="other", group="governor.slice/other")
    other = FakeRouter({"x": "loaded"})
    try:
        Publisher(run, "other").publish(_router_state(elsewhere, other.url, launch_pid))
        handler = Unload(Env(fake_fs, plan, lambda: [], journal=Journal(run / plan.policy)))
        res = handler.run(parse_action("unload"), CTX)  # type: ignore[arg-type]
        assert res.ok and res.after["model"] == "a" and other.calls == []
    finally:
        other.close()
