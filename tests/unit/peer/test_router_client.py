"""governor/peer/router.py (and supervise/activity.py's Activity) against a local HTTP server that answers as llama-server's
router does (measured with the build of notes/engine.md: GET /models, a proxied GET /slots
answered chunked even to HTTP/1.0, POST /models/unload)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from governor.errors import GovernorError
from governor.monitor.actions.unload import unload_lru
from governor.peer.router import (
    FRESH_S,
    RouterClient,
    RouterError,
    base_url,
    idle_lru,
)
from governor.supervise.activity import Activity


class FakeRouter:
    def __init__(self) -> None:
        self.status = {"a": "loaded", "b": "loaded", "c": "unloaded", "d": "loading"}
        self.processing: set[str] = set()
        self.no_slots: set[str] = set()
        self.unloaded: list[str] = []
        self.asked: list[str] = []


def _handler(fake: FakeRouter) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            pass

        def _send(self, status: int, body: Any, *, chunked: bool = False) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                half = len(data) // 2
                for part in (data[:half], data[half:]):
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def do_GET(self) -> None:
            fake.asked.append(self.path)
            if self.path == "/models":
                data = [{"id": n, "status": {"value": v}} for n, v in fake.status.items()]
                self._send(200, {"data": data, "object": "list"})
                return
            if self.path.startswith("/slots?model="):
                name = self.path.split("=", 1)[1].split("&", 1)[0]
                assert self.path.endswith("&autoload=false")  # never loads a model to ask
                if name in fake.no_slots or fake.status.get(name) not in ("loaded", "sleeping"):
                    self._send(501, {"error": {"message": "not supported"}})
                    return
                slots = [{"id": 0, "is_processing": False}, {"id": 1, "is_processing": False}]
                slots[1]["is_processing"] = name in fake.processing
                self._send(200, slots, chunked=True)
                return
            self._send(404, {})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length))
            if self.path == "/models/unload" and fake.status.get(body["model"]) == "loaded":
                fake.unloaded.append(body["model"])
                fake.status[body["model"]] = "unloaded"
                self._send(200, {"success": True})
                return
            self._send(400, {"error": {"message": "model is not running"}})

    return H


@pytest.fixture
def router() -> Iterator[tuple[FakeRouter, RouterClient]]:
    fake = FakeRouter()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, RouterClient(f"http://127.0.0.1:{server.server_port}/health", timeout=5)
    finally:
        server.shutdown()
        server.server_close()


def test_models_busy_and_unload_as_the_router_answers_them(
    router: tuple[FakeRouter, RouterClient],
) -> None:
    fake, client = router
    assert client.models() == fake.status
    assert client.busy("a") is False
    fake.processing.add("a")
    assert client.busy("a") is True  # one slot of two is processing: a request in flight
    assert client.busy("c") is None  # not running: its slots cannot be read
    fake.no_slots.add("b")
    assert client.busy("b") is None  # --no-slots: unknown, never taken for idle
    assert client.unload("b") is True and fake.unloaded == ["b"]
    assert client.unload("c") is False  # "model is not running": refused, said, not raised


def test_idle_lru_orders_by_last_request_and_skips_busy_loading_unknown_and_excluded(
    router: tuple[FakeRouter, RouterClient],
) -> None:
    fake, client = router
    fake.status = {"a": "loaded", "b": "loaded", "e": "sleeping", "d": "loading", "c": "unloaded"}
    last = {"a": 30.0, "b": 10.0, "e": 20.0}
    assert idle_lru(client, last) == ["b", "e", "a"]
    fake.processing.add("b")
    assert idle_lru(client, last) == ["e", "a"]
    assert idle_lru(client, last, exclude=["e"]) == ["a"]
    fake.no_slots.add("a")
    assert idle_lru(client, last, exclude=["e"]) == []
    assert idle_lru(client, {}, statuses={"a": "loaded", "e": "sleeping"}) == ["e"]


def test_a_model_loaded_or_asked_under_fresh_s_ago_is_not_idle_to_a_pressure_unload(
    router: tuple[FakeRouter, RouterClient],
) -> None:
    """The dashboard guest test's HTTP 500 (CI 2026-12-06): an unload under pressure took the
    model its router had just loaded for a request still on its way to the slot."""
    fake, client = router
    fake.status = {"a": "loaded", "b": "loaded"}
    last = {"a": 1000.0, "b": 1096.0}  # b loaded (or answered) 4 s before now
    assert idle_lru(client, last, fresh_s=FRESH_S, now=1100.0) == ["a"]
    assert idle_lru(client, last, fresh_s=FRESH_S, now=1101.0) == ["a", "b"]  # 5 s: idle
    assert idle_lru(client, last) == ["a", "b"]  # no grace asked (the evictor's own order)
    assert idle_lru(client, {"a": None}, fresh_s=FRESH_S, now=1100.0) == ["a", "b"]  # unknown
    fake.status = {"b": "loaded"}
    with pytest.raises(GovernorError, match="no idle model to unload"):  # the unload verb
        unload_lru(lambda _u: client, "http://x", {"b": time.time()}, "s/r")
    assert fake.unloaded == []
    assert unload_lru(lambda _u: client, "http://x", {"b": time.time() - FRESH_S}, "s/r") == "b"


def test_a_router_that_does_not_answer_is_one_error_that_says_where() -> None:
    client = RouterClient("http://127.0.0.1:9/health", timeout=1)  # discard: nothing listens
    with pytest.raises(RouterError, match=r"\(http://127\.0\.0\.1:9/models\)$"):
        client.models()
    assert client.busy("a") is None
    assert client.unload("a") is False


def test_base_url() -> None:
    assert base_url("http://127.0.0.1:8080/health") == "http://127.0.0.1:8080"
    assert base_url("http://[::1]:8080/x") == "http://[::1]:8080"
    with pytest.raises(ValueError):
        base_url("http://nohost/")


class _Leaves:
    """The two CgroupFs reads Activity makes: the model leaves and their cpu.stat."""

    def __init__(self) -> None:
        self.usage = {"a": 0, "b": 0}

    def children(self, cgroup: str) -> list[str]:
        return [f"{cgroup}/{a}" for a in self.usage]

    def cpu_stat(self, cgroup: str) -> dict[str, int]:
        return {"usage_usec": self.usage[cgroup.rsplit("/", 1)[1]]}


class _Slots:
    def __init__(self) -> None:
        self.tasks: dict[str, list[dict[str, Any]] | None] = {"a": [], "b": []}
        self.asked = 0

    def slots(self, model: str) -> list[dict[str, Any]] | None:
        self.asked += 1
        return self.tasks[model]


def test_only_a_new_task_in_a_slot_dates_a_request_not_the_cpu_of_a_probe() -> None:
    """CPU alone (another governor's GET /slots, the child's own housekeeping) does not move
    a model's last request: its slots must show a new task or one in flight; a child whose
    slots cannot be read is dated by its CPU."""
    fs, client = _Leaves(), _Slots()
    now = [100.0]
    act = Activity(fs, "g", clock=lambda: now[0], client=client)  # type: ignore[arg-type]
    assert act.sample() is False  # the first look is the base
    client.tasks["a"] = [{"id": 0, "id_task": 7, "is_processing": False}]
    fs.usage["a"] += 50_000  # a request: a new task
    now[0] = 101.0
    assert act.sample() is True and act.last == {"a": 101.0}
    fs.usage["a"] += 5_000  # CPU, the same task: a probe, no request
    now[0] = 102.0
    assert act.sample() is False and act.last == {"a": 101.0}
    client.tasks["a"] = [{"id": 0, "id_task": 7, "is_processing": True}]
    fs.usage["a"] += 5_000  # the same task still running (a long answer): in use
    now[0] = 103.0
    assert act.sample() is True and act.last["a"] == 103.0
    fs.usage["b"] += 1_000  # under the threshold: not even asked
    asked = client.asked
    assert act.sample() is False and client.asked == asked
    client.tasks["b"] = None  # --no-slots: the CPU decides
    fs.usage["b"] += 9_000
    now[0] = 104.0
    assert act.sample() is True and act.last["b"] == 104.0
    bare = Activity(fs, "g", clock=lambda: now[0])  # type: ignore[arg-type]
    bare.sample()
    fs.usage["a"] += 9_000
    assert bare.sample() is True  # without a client: the CPU alone
