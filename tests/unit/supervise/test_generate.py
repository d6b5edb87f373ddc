"""The one-token liveness probe (governor/supervise/generate.py, issue 46 item 5): a server whose
/health stays green while its generation hangs is found unresponsive after FAILS probes in a
row; one that generates never is; a good answer between failures resets the count; and what the
supervisor does then (journal, relaunch within the budget, else stop and fail).

A real HTTP server on loopback stands in for llama-server (/health 200 always, /v1/completions
as the test says); events, not sleeps, decide the outcome."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from governor.monitor.restart import Restarts
from governor.peer import http as peer
from governor.policy.loader import load_text
from governor.rundir.journal import Journal
from governor.supervise import generate, ready


class _Server(http.server.BaseHTTPRequestHandler):
    mode = "ok"  # ok | hang | 503
    released: ClassVar[threading.Event]
    bodies: ClassVar[list[dict[str, object]]]
    asked: ClassVar[threading.Semaphore]

    def do_GET(self) -> None:  # /health: always green
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self) -> None:
        cls = type(self)
        length = int(self.headers.get("Content-Length", "0"))
        cls.bodies.append({"path": self.path, **json.loads(self.rfile.read(length))})
        cls.asked.release()
        if cls.mode == "hang":
            cls.released.wait(30)  # a stuck generation: no answer until the test ends
            return
        body = b'{"choices": [{"text": "k"}]}'
        self.send_response(200 if cls.mode == "ok" else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[type[_Server], ready.Endpoint]]:
    class Handler(_Server):  # a class of its own: the counters are this test's
        released = threading.Event()
        bodies: ClassVar[list[dict[str, object]]] = []
        asked = threading.Semaphore(0)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield Handler, ready.Endpoint("127.0.0.1", srv.server_address[1], "/health")
    finally:
        Handler.released.set()
        srv.shutdown()
        srv.server_close()


def test_a_green_health_with_a_hanging_generation_is_unresponsive_after_three_in_a_row(
    server: tuple[type[_Server], ready.Endpoint],
) -> None:
    handler, ep = server
    handler.mode = "hang"
    assert ready.probe(ep) == 200  # what the readiness probe sees: all is well
    why: list[str] = []
    done = threading.Event()

    def on_unresponsive(message: str) -> None:
        why.append(message)
        done.set()

    probe = generate.GenerateProbe(ep, 0.2, on_unresponsive=on_unresponsive).start()
    try:
        assert done.wait(30)
    finally:
        probe.stop()
    assert probe.failed == generate.FAILS == 3 and probe.asked == 3
    url = f"http://127.0.0.1:{ep.port}/v1/completions"
    assert why == [
        f"{url} gave no token within 0.2s 3 times in a row (no whole answer within 0.2s;"
        " engine.probe_generate)"
    ]
    # it asked for ONE token, through the OpenAI route and llama-server's own key
    assert handler.bodies[0] == {
        "path": "/v1/completions", "prompt": "ok", "max_tokens": 1, "n_predict": 1, "stream": False,
    }  # fmt: skip


def test_a_server_that_generates_is_never_unresponsive(
    server: tuple[type[_Server], ready.Endpoint],
) -> None:
    handler, ep = server
    called: list[str] = []
    # 0.5 s: the interval is each probe's deadline, generous for a loaded test machine
    probe = generate.GenerateProbe(ep, 0.5, on_unresponsive=called.append).start()
    try:
        for _ in range(3):  # as many as make it unresponsive had they failed
            assert handler.asked.acquire(timeout=30)
    finally:
        probe.stop()
    assert called == [] and probe.failed == 0 and probe.asked >= 2


def test_a_good_answer_resets_the_count_and_a_non_200_is_a_failure(
    server: tuple[type[_Server], ready.Endpoint],
) -> None:
    handler, ep = server
    handler.mode = "503"
    assert generate.ask(ep, 5) == "it answered 503"
    handler.mode = "ok"
    assert generate.ask(ep, 5) is None
    nothing = ready.Endpoint("127.0.0.1", 1, "/health")  # nothing listens on port 1
    assert generate.ask(nothing, 5) is not None
    # fail, fail, ok, fail, fail, then no answer: the count restarts at the good answer, so
    # only the sixth probe is the third failure in a row
    answers = iter([500, 500, 200, 500, 500])
    called: list[str] = []
    done = threading.Event()

    def fake(_host: str, _port: int, method: str, *_args: object, **_kw: object) -> peer.Answer:
        if method == "GET":
            return peer.Answer(404)  # GET /slots: --no-slots
        status = next(answers, None)
        if status is None:
            raise peer.HttpError("it closed the connection", url="u")
        return peer.Answer(status)

    def on_unresponsive(why: str) -> None:
        called.append(why)
        done.set()

    probe = generate.GenerateProbe(ep, 0.001, on_unresponsive=on_unresponsive, exchange=fake)
    probe.start()
    assert done.wait(10)
    probe.stop()
    assert probe.asked == 6 and len(called) == 1
    assert "3 times in a row (it closed the connection;" in called[0]


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_unresponsive_journals_and_asks_a_relaunch_while_the_budget_allows(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "chat")
    restarts = Restarts(limit=1, base_s=0.0)
    proc = _sleeper()
    stopped: list[int] = []

    def stop(pid: int) -> str:
        stopped.append(pid)
        proc.kill()
        return "SIGTERM"

    try:
        assert generate.unresponsive(
            proc.pid, "no token", restarts=restarts, journal=journal, stop_engine=stop
        ) is None  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    assert stopped == [proc.pid]
    assert restarts.pending is not None and restarts.pending.when == "probe_generate"
    (entry,) = journal.entries()
    assert (entry["source"], entry["reason"], entry["step"]) == (
        "probe_generate", "no token", "restart",
    )  # fmt: skip
    # the budget spent: the engine is stopped and the launch fails with why
    restarts.take()
    restarts.history.append({})
    proc = _sleeper()
    try:
        failed = generate.unresponsive(
            proc.pid, "no token", restarts=restarts, journal=journal, stop_engine=stop
        )
    finally:
        proc.kill()
        proc.wait()
    assert failed == "no token; it was stopped (SIGTERM; restart limit 1 reached)"
    assert restarts.pending is None and journal.entries()[-1]["step"] == "stop"


def test_an_engine_gone_meanwhile_is_left_to_the_launcher(tmp_path: Path) -> None:
    proc = _sleeper()
    proc.kill()
    proc.wait()
    restarts = Restarts(limit=3, base_s=0.0)
    journal = Journal(tmp_path / "chat")
    assert generate.unresponsive(
        proc.pid, "x", restarts=restarts, journal=journal, stop_engine=lambda p: "no"
    ) is None  # fmt: skip
    assert restarts.pending is None and journal.entries() == []
    assert not generate.alive(proc.pid) and generate.alive(os.getpid())


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ('kind = "llama.cpp"\nprobe_generate = "500ms"', "at least 1s, got 500ms"),
        ('kind = "llama.cpp"\nprobe_generate = "999ms"', "at least 1s"),
        ('kind = "rkllm"\nprobe_generate = "30s"', "it needs engine.ready"),
        ('ready = "exec"\nkind = "llama.cpp"\nprobe_generate = "30s"', "not 'exec'"),
        ('kind = "llama.cpp"\nprobe_generate = 30', "duration"),
    ],
)
def test_the_policy_key_refuses_what_cannot_probe(engine: str, message: str) -> None:
    from governor.errors import PolicyError

    with pytest.raises(PolicyError, match=message):
        load_text(f'name = "s"\n[engine]\n{engine}\n', source="t.toml")


def test_the_policy_key_compiles_to_seconds_and_is_off_when_absent() -> None:
    on = load_text(
        'name = "s"\n[engine]\nkind = "generic"\nready = "http://127.0.0.1:1/h"\n'
        'probe_generate = "1m"\n',
        source="t.toml",
    )
    assert on.engine.probe_generate is not None and on.engine.probe_generate.seconds == 60
    off = load_text('name = "s"\n[engine]\nkind = "llama.cpp"\n', source="t.toml")
    assert off.engine.probe_generate is None


@pytest.mark.parametrize(("moving", "unresponsive"), [(True, False), (False, True)])
def test_a_slot_that_decodes_is_busy_and_one_that_does_not_is_stuck(
    moving: bool, unresponsive: bool
) -> None:
    """-np 1 and a long generation: the probe waits past its deadline each time, but the slot's
    n_decoded moves (busy: never counted); a slot whose count stays is stuck (counted)."""
    decoded = iter(range(100))
    posts = threading.Semaphore(0)
    called: list[str] = []

    def fake(_host: str, _port: int, method: str, path: str, **_kw: object) -> peer.Answer:
        if method == "POST":
            posts.release()
            raise peer.HttpError("no whole answer within 0.01s", url=path)
        n = next(decoded) if moving else 7
        slot = {"id": 0, "id_task": 3, "is_processing": True, "next_token": [{"n_decoded": n}]}
        return peer.Answer(200, json.dumps([slot, {"id": 1, "is_processing": False}]).encode())

    ep = ready.Endpoint("127.0.0.1", 1, "/health")
    probe = generate.GenerateProbe(ep, 0.001, on_unresponsive=called.append, exchange=fake)
    probe.start()
    try:
        # 8 probes that failed, or the third counted one: the stuck slot's is the fourth
        # (the first look at a slot has nothing to compare with: busy)
        got = 0
        for _ in range(200):  # at most ~10 s
            got += posts.acquire(timeout=0.05)
            if got >= 8 or called:
                break
    finally:
        probe.stop()
    assert bool(called) == unresponsive
    assert probe.asked == (4 if unresponsive else probe.asked) and probe.asked >= 4
    if not unresponsive:
        assert probe.failed == 0
