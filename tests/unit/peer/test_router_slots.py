"""Issue 46 item 3: an evicted model's idle slots saved through llama-server's router before its
unload and restored after its next load (governor/supervise/slots.py, peer/router.py), against
a local HTTP server that routes /slots as the b11312 router does (server.cpp
``routes.post_slots = models_routes->proxy_post``: the model from the JSON body, the path and
query passed on to the child; ``autoload=false`` refuses a model that is not running)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from governor.peer.router import RouterClient, RouterError, slot_file
from governor.plan.llama_args import slot_save_path
from governor.supervise.slots import GRACE_S, POLL_S, SlotKeeper

FORBIDDEN = set('/\\:*?"<>|')  # llama.cpp's fs_validate_filename


class FakeRouter:
    """Each model's status and slots ({id, is_processing, id_task?}); the files saved in the
    shared --slot-save-path ({name: (model, slot, id_task)}); every slot action in ``actions``."""

    def __init__(self) -> None:
        self.status = {"a": "loaded", "b": "loaded"}
        self.slots: dict[str, list[dict[str, Any]]] = {
            "a": [
                {"id": 0, "is_processing": False, "id_task": 5},
                {"id": 1, "is_processing": False},
            ],
            "b": [{"id": 0, "is_processing": True, "id_task": 9}],
        }
        self.save_path = True  # started with --slot-save-path
        self.files: dict[str, tuple[str, int, Any]] = {}
        self.actions: list[tuple[str, str, int, str]] = []
        self.models_asked = 0

    def load(self, model: str) -> None:
        """The child starts again: fresh slots, nothing served."""
        self.status[model] = "loaded"
        self.slots[model] = [{"id": 0, "is_processing": False}, {"id": 1, "is_processing": False}]


def _handler(fake: FakeRouter) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if url.path == "/models":
                fake.models_asked += 1
                data = [{"id": n, "status": {"value": v}} for n, v in fake.status.items()]
                self._send(200, {"data": data})
            elif url.path == "/slots" and fake.status.get(query["model"][0]) == "loaded":
                self._send(200, fake.slots[query["model"][0]])
            else:
                self._send(400, {"error": {"message": "model is not loaded"}})

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            model, name = body.get("model", ""), body.get("filename", "")
            if not url.path.startswith("/slots/") or query.get("autoload") != ["false"]:
                self._send(404, {})  # the governor never lets a slot action load a model
                return
            if fake.status.get(model) != "loaded":
                self._send(400, {"error": {"message": "model is not loaded"}})
                return
            if not fake.save_path:
                msg = "This server does not support slots action. Start it with `--slot-save-path`"
                self._send(501, {"error": {"code": 501, "message": msg}})
                return
            slot, action = int(url.path.rsplit("/", 1)[1]), query["action"][0]
            assert name and not FORBIDDEN & set(name), name
            fake.actions.append((action, model, slot, name))
            entry = fake.slots[model][slot]
            if action == "save":
                fake.files[name] = (model, slot, entry.get("id_task"))
                self._send(200, {"id_slot": slot, "n_saved": 12, "n_written": 4096})
            else:
                was = fake.files[name]
                entry["restored"] = was
                self._send(200, {"id_slot": slot, "n_restored": 12, "timings": {"restore_ms": 1}})

    return H


@pytest.fixture
def router() -> Iterator[tuple[FakeRouter, RouterClient]]:
    fake = FakeRouter()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield fake, RouterClient(f"http://127.0.0.1:{server.server_port}", timeout=5)
    finally:
        server.shutdown()
        server.server_close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_evicted_models_conversation_is_saved_and_restored_at_its_next_load(
    router: tuple[FakeRouter, RouterClient],
) -> None:
    fake, client = router
    clock = Clock()
    keeper = SlotKeeper(client, clock=clock)
    # slot 0 holds a conversation (task 5), slot 1 never served one: only slot 0 is saved
    assert keeper.save("a") == [0]
    assert fake.actions == [("save", "a", 0, slot_file("a", 0))]
    fake.status["a"] = "unloaded"  # the evictor's unload
    keeper.placed("a")  # its next child starts
    fake.status["a"] = "loading"
    assert keeper.restore() == {}  # still loading: watched
    clock.now += 2 * POLL_S
    fake.load("a")
    assert keeper.restore() == {"a": [0]}
    assert fake.actions[-1] == ("restore", "a", 0, slot_file("a", 0))
    assert fake.slots["a"][0]["restored"] == ("a", 0, 5)  # the conversation of task 5
    assert keeper.pending == {} and keeper.saved == {} and keeper.restored == {"a": 1}
    clock.now += 2 * POLL_S
    asked = fake.models_asked
    assert keeper.restore() == {} and fake.models_asked == asked  # nothing pending: no call


def test_a_slot_a_request_took_first_keeps_that_requests_cache(
    router: tuple[FakeRouter, RouterClient],
) -> None:
    """A restore into a slot in use would be deferred and then overwrite that request's cache
    (server-context.cpp SLOT_RESTORE): such a slot is left alone."""
    fake, client = router
    keeper = SlotKeeper(client, clock=Clock())
    assert keeper.save("a") == [0]
    keeper.placed("a")
    fake.load("a")
    fake.slots["a"][0] = {"id": 0, "is_processing": True, "id_task": 1}  # the loading request
    assert keeper.restore() == {"a": []}
    assert [a for a, *_ in fake.actions] == ["save"] and keeper.pending == {}


def test_busy_slots_a_router_without_slot_save_path_and_unwatched_loads(
    router: tuple[FakeRouter, RouterClient],
) -> None:
    fake, client = router
    clock = Clock()
    keeper = SlotKeeper(client, clock=clock)
    assert keeper.save("b") == []  # its one slot is processing: nothing saved
    keeper.placed("b")
    assert keeper.pending == {}  # nothing saved: its load is not watched
    fake.save_path = False
    assert keeper.save("a") == [] and keeper.saved == {}  # refused, said, nothing half-kept
    with pytest.raises(RouterError, match="--slot-save-path"):
        client.slot_action("a", 0, "save", slot_file("a", 0))
    fake.save_path = True
    assert keeper.save("a") == [0]
    keeper.placed("a")
    fake.status["a"] = "unloaded"  # the child died loading: dropped after GRACE_S
    assert keeper.restore() == {} and "a" in keeper.pending
    clock.now += GRACE_S + 1
    assert keeper.restore() == {} and keeper.pending == {} and keeper.saved == {}


def test_slot_files_are_names_llama_cpp_takes_one_per_model_and_slot() -> None:
    names = {slot_file(m, s) for m in ("a", "a/b", "a_b", "x:y*", "é 😀 ", "") for s in (0, 1)}
    assert len(names) == 12
    for name in names:
        assert not FORBIDDEN & set(name) and name.isascii() and len(name) < 255
        assert not name.endswith((".", " ")) and not name.startswith(" ")
    assert slot_file("a", 0) == slot_file("a", 0)  # overwritten at each save


def test_slot_save_path_from_the_argv_or_the_environment() -> None:
    argv = ("llama-server", "--models-dir", "/m")
    assert slot_save_path(argv, {}) is None
    assert slot_save_path((*argv, "--slot-save-path", "/s"), {}) == "/s"
    assert slot_save_path(argv, {"LLAMA_ARG_SLOT_SAVE_PATH": "/e"}) == "/e"
    assert (
        slot_save_path((*argv, "--slot-save-path=/s"), {"LLAMA_ARG_SLOT_SAVE_PATH": "/e"}) == "/s"
    )
    # its value is no option of its own (the walk of llama_args.options)
    assert slot_save_path(("llama-server", "-p", "--slot-save-path", "/x"), {}) is None


def test_check_warns_of_a_slot_save_path_whose_slots_the_governor_will_not_save() -> None:
    from governor.engines.llama import parse_llama_argv, slot_warnings

    router = ["llama-server", "--models-dir", "/m", "--slot-save-path", "/s"]
    assert slot_warnings(parse_llama_argv(router), evict=True) == []  # saved and restored
    [(key, why)] = slot_warnings(parse_llama_argv(router), evict=False)
    assert key == "engine.slots" and 'evict = "memory"' in why
    [(_, why)] = slot_warnings(parse_llama_argv([*router, "--no-slots"]), evict=True)
    assert "--no-slots" in why
    assert slot_warnings(parse_llama_argv(router[:3]), evict=False) == []  # no save path
    single = ["llama-server", "-m", "/m/a.gguf", "--slot-save-path", "/s"]
    assert slot_warnings(parse_llama_argv(single), evict=False) == []  # no router


class _NoSlots:
    """A router whose child runs with --no-slots: GET /slots answers nothing readable; each
    probe recorded as RouterClient.slots records it."""

    url = "http://127.0.0.1:1"

    def slots(self, model: str) -> None:
        from governor.peer.router import note_probe

        note_probe(self.url, model)


class _Leaf:
    def __init__(self) -> None:
        self.usage = 0

    def children(self, cgroup: str) -> list[str]:
        return [f"{cgroup}/a"]

    def cpu_stat(self, cgroup: str) -> dict[str, int]:
        return {"usage_usec": self.usage}


def test_with_no_slots_the_cpu_of_this_processs_own_probes_dates_no_request() -> None:
    """Issue 46 item 5: a --no-slots model is dated by its CPU, which every probe of its slots
    (the evictor's, the unload action's) costs it; a probe in the interval is not a request,
    the activity's own probe does not hide the next request."""
    from governor.peer.router import note_probe
    from governor.supervise.activity import Activity

    fs, client = _Leaf(), _NoSlots()
    wall, mono = [100.0], [0.0]
    act = Activity(
        fs, "g", clock=lambda: wall[0], client=client, mono=lambda: mono[0],  # type: ignore[arg-type]
    )  # fmt: skip
    act.sample()  # the base
    for step, probe, dated in (
        (1, False, True),
        (2, False, True),
        (3, True, False),
        (4, False, True),
    ):
        mono[0] = wall[0] = 100.0 + step
        if probe:  # another client of this process asked its slots in this interval
            note_probe(client.url, "a", mono[0] - 0.5)
        fs.usage += 9_000
        assert act.sample() is dated, step
    assert act.last == {"a": 104.0} and act.unreadable == {"a"}
