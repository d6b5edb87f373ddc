"""Ready means ready (governor/supervise/ready.py): READY=1 once the engine's ready URL answers
200, not at exec; a server that never does is stopped, the run fails with 69.

A real HTTP server on loopback stands in for llama-server's /health (503 while loading, then
200); events, not sleeps, decide the outcome."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.plan.model import Plan
from governor.policy.loader import load_text
from governor.supervise import ready


class _Health(http.server.BaseHTTPRequestHandler):
    status = 503
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(type(self).status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health() -> Iterator[tuple[type[_Health], ready.Endpoint]]:
    handler = type("H", (_Health,), {"status": 503, "hits": 0})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield handler, ready.Endpoint("127.0.0.1", srv.server_address[1], "/health")
    finally:
        srv.shutdown()
        srv.server_close()


def test_probe_reads_the_status_and_none_when_nothing_listens(
    health: tuple[type[_Health], ready.Endpoint],
) -> None:
    handler, ep = health
    assert ready.probe(ep) == 503
    handler.status = 200
    assert ready.probe(ep) == 200
    assert ready.probe(ready.Endpoint("127.0.0.1", ep.port, "/nope")) == 404
    free = ready.Endpoint("127.0.0.1", 1, "/health")  # nothing listens on port 1
    assert ready.probe(free) is None


def test_the_wait_ends_on_the_first_200_not_before(
    health: tuple[type[_Health], ready.Endpoint],
) -> None:
    handler, ep = health
    done = threading.Event()
    seen: list[object] = []

    def on_ready(waited: float) -> None:
        seen.append(waited)
        done.set()

    w = ready.ReadyWait(ep, 60, on_ready=on_ready, on_timeout=seen.append, interval_s=0.01)
    w.start()
    try:
        while handler.hits < 3:  # it keeps asking while the server says 503
            assert not done.wait(0.01)
        assert not seen
        handler.status = 200
        assert done.wait(10)
    finally:
        w.stop()
    assert len(seen) == 1 and isinstance(seen[0], float) and w.last_status == 200


def test_a_server_that_never_answers_200_times_out_with_the_url_and_the_key(
    health: tuple[type[_Health], ready.Endpoint],
) -> None:
    _handler, ep = health
    why: list[str] = []
    ticks = iter(range(1000))
    done = threading.Event()

    def on_timeout(message: str) -> None:
        why.append(message)
        done.set()

    w = ready.ReadyWait(
        ep, 3, on_ready=lambda s: None, on_timeout=on_timeout,
        clock=lambda: float(next(ticks)), interval_s=0.0,
    ).start()  # fmt: skip
    assert done.wait(10)
    w.stop()
    assert why == [f"{ep.url} answered 503 within 3s (engine.ready_timeout)"]


def test_server_url_from_host_and_port() -> None:
    assert ready.server_url(None, None) == "http://127.0.0.1:8080/health"
    assert ready.server_url("0.0.0.0", 9000) == "http://127.0.0.1:9000/health"
    assert ready.server_url("::", 9000) == "http://[::1]:9000/health"
    assert ready.parse("http://[::1]:9000/health") == ready.Endpoint("::1", 9000, "/health")
    # llama-server --host takes a comma-separated list; .sock entries are UNIX sockets
    assert ready.server_url("/run/l.sock, 10.0.0.2,::1", 9000) == "http://10.0.0.2:9000/health"
    assert ready.server_url("0.0.0.0,::", 80) == "http://127.0.0.1:80/health"


@pytest.mark.parametrize(
    ("value", "ok"),
    [("exec", True), ("http://127.0.0.1:8080/health", True), ("https://x:1/", False),
     ("http://host/health", False), ("http://h:99999/", False), ("ftp://h:1/", False)],
)  # fmt: skip
def test_the_policy_key_takes_exec_or_an_http_url_with_a_port(value: str, ok: bool) -> None:
    from governor.errors import PolicyError

    text = f'name = "s"\n[engine]\nkind = "llama.cpp"\nready = "{value}"\nready_timeout = "20s"\n'
    if ok:
        policy = load_text(text, source="t.toml")
        assert policy.engine.ready == value and policy.engine.ready_timeout.seconds == 20
    else:
        with pytest.raises(PolicyError, match=r"engine\.ready"):
            load_text(text, source="t.toml")


def test_launch_compiles_the_ready_url_from_the_server_argv(tmp_path: Path) -> None:
    from governor.api.launch_compile import ready_url as _ready_url
    from governor.engines.llama import parse_llama_argv

    def plan(ready_key: str | None) -> Plan:
        from types import SimpleNamespace
        from typing import cast

        from governor.plan.model import EngineSpec

        # _ready_url reads plan.engine only
        return cast(Plan, SimpleNamespace(engine=EngineSpec(kind="llama.cpp", ready=ready_key)))

    server = parse_llama_argv(["/x/llama-server", "--port", "9001", "--host", "0.0.0.0"])
    oneshot = parse_llama_argv(["/x/llama-completion", "-p", "hi"])
    assert _ready_url(plan(None), server) == "http://127.0.0.1:9001/health"
    assert _ready_url(plan(None), oneshot) is None
    assert _ready_url(plan("exec"), server) is None
    assert _ready_url(plan("http://127.0.0.1:7/up"), oneshot) == "http://127.0.0.1:7/up"
