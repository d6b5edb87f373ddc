"""llama-server's router as the governor talks to it (issue 38 items 3 and 4): which models are
loaded, whether one has a request in flight, and unloading one.

- ``GET /models``: every model with ``status.value`` (unloaded, loading, loaded, sleeping,
  ...) (tools/server/server-models.cpp, the build of notes/engine.md);
- ``GET /slots?model=NAME&autoload=false``: the child's slots, proxied by the router without
  loading a model that is not running (``autoload=false``; a GET never moves the router's own
  ``last_used``); a slot with ``is_processing`` true is a request in flight. A child started
  with ``--no-slots`` answers an error: its in-flight state is unknown (None);
- ``POST /models/unload {"model": NAME}``: the router stops that child at once (it exits
  within the preset's ``stop-timeout``, 10 s by default);
- ``POST /slots/ID?action=save|restore&autoload=false {"model": NAME, "filename": F}`` (issue
  46 item 3): the router proxies it to that model's child (server.cpp ``routes.post_slots =
  models_routes->proxy_post``: the model is read from the JSON body; ``autoload=false``: never
  loads a model that is not running), which writes or reads the slot's KV cache as F in its
  ``--slot-save-path`` (the router's own, passed on to every child: server-models.cpp copies
  its options into each child's preset). A restore of a slot in flight is deferred by the
  child until the slot is free and then overwrites what that request left
  (server-context.cpp SLOT_RESTORE): only a slot that never served a task is restored.

The router keeps its own least-recently-used time (``meta.last_used``) but publishes it
nowhere: each model's last request is the supervisor's (supervise/activity.py), handed to
:func:`idle_lru` as a mapping. The client sits below every room that talks to the router (the
supervisor's evictor, the monitor's unload and shed): an exchange with another process.

Standard library only (the run time's import set): each call is one exchange of
governor/peer/http.py (a deadline for the whole request, a body cap), as ready.py's probe.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit
from zlib import crc32

from governor.errors import GovernorError
from governor.log import get_logger
from governor.peer import http

log = get_logger(__name__)

TIMEOUT_S = 5.0  # one whole request to the router (it answers /models and /slots at once)
# the router's status values of a model that holds memory (server_model_status_to_string)
RUNNING = frozenset({"loading", "loaded", "sleeping"})
# a model whose last request (or load: supervise/loads.py touches it when the router says
# "loaded") is this recent is not idle to an unload under pressure or a shed: the request that
# loaded it may not have reached its slot yet, and its unload would fail that request (HTTP 500
# from the router; the dashboard guest test, CI 2026-12-06)
FRESH_S = 5.0
# (router url, model) -> time.monotonic() of this process's last GET /slots of it: the CPU it
# costs the child is no request (supervise/activity.py, whose --no-slots models have no other
# way to tell); every client of this process records here, whichever thread it runs in
_PROBED: dict[tuple[str, str], float] = {}


def probed_at(url: str, model: str) -> float | None:
    """When this process last asked ``model``'s slots at the router ``url`` (monotonic)."""
    return _PROBED.get((url, model))


def note_probe(url: str, model: str, when: float | None = None) -> None:
    _PROBED[(url, model)] = time.monotonic() if when is None else when


class RouterError(GovernorError):
    """The router did not answer, or answered something that is not what llama-server says."""


def base_url(url: str) -> str:
    """http://HOST:PORT of any URL of the server (its /health, say)."""
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"not an http://HOST:PORT URL: {url!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{parts.port}"


class RouterClient:
    """The three calls the governor makes to a llama-server router at ``url``: each one
    exchange (governor/peer/http.py) within ``timeout`` seconds in all, and, with
    ``budget_s``, every call of this client within ``budget_s`` of its construction (the
    shed's unload: a victim's router that trickles costs the shedder at most that)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = TIMEOUT_S,
        budget_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(base_url(url))
        assert parts.hostname is not None and parts.port is not None
        self.host, self.port = parts.hostname, parts.port
        self.url = base_url(url)
        self.timeout = timeout
        self.budget_s = budget_s
        self.clock = clock
        self.until = None if budget_s is None else clock() + budget_s

    def within(self, budget_s: float) -> RouterClient:
        """This router's client whose calls all end within ``budget_s`` from now."""
        return RouterClient(
            self.url, timeout=min(self.timeout, budget_s), budget_s=budget_s, clock=self.clock
        )

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(HTTP status, the JSON body or None); RouterError when nothing answers within the
        deadline, or answers more than the cap (governor/peer/http.py)."""
        deadline = self.timeout
        if self.until is not None:
            deadline = min(deadline, self.until - self.clock())
            if deadline <= 0:
                raise RouterError(
                    f"the router did not answer {method}: its {self.budget_s:g}s budget is"
                    f" spent ({self.url}{path})"
                )
        try:
            answer = http.exchange(
                self.host, self.port, method, path, deadline_s=deadline,
                body=None if body is None else json.dumps(body).encode(),
                content_type=None if body is None else "application/json",
            )  # fmt: skip
        except http.HttpError as err:
            raise RouterError(
                f"the router did not answer {method}: {err.problem} ({self.url}{path})"
            ) from None
        payload = answer.body
        try:
            return answer.status, json.loads(payload) if payload.strip() else None
        except ValueError:
            return answer.status, None

    def models(self) -> dict[str, str]:
        """{name: status} of every model the router lists (GET /models)."""
        status, body = self.request("GET", "/models")
        items = body.get("data") if isinstance(body, dict) else None
        if status != 200 or not isinstance(items, list):
            raise RouterError(f"the router answered {status} to GET ({self.url}/models)")
        out: dict[str, str] = {}
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                continue
            st = item.get("status")
            value = st.get("value") if isinstance(st, dict) else st
            out[item["id"]] = value if isinstance(value, str) else "unknown"
        return out

    def slots(self, model: str) -> list[dict[str, Any]] | None:
        """The child's slots (GET /slots, never loading the model); None when they cannot be
        read (not running, --no-slots, no answer)."""
        note_probe(self.url, model)
        try:
            status, body = self.request(
                "GET", f"/slots?model={quote(model, safe='')}&autoload=false"
            )
        except RouterError:
            return None
        if status != 200 or not isinstance(body, list):
            return None
        return [s for s in body if isinstance(s, dict)]

    def busy(self, model: str) -> bool | None:
        """Whether ``model`` has a request in flight (a slot is processing); None when its
        slots cannot be read (not running, --no-slots, no answer)."""
        slots = self.slots(model)
        return None if slots is None else any(s.get("is_processing") for s in slots)

    def unload(self, model: str) -> bool:
        """POST /models/unload; True when the router took it (it stops the child at once)."""
        try:
            status, body = self.request("POST", "/models/unload", {"model": model})
        except RouterError as err:
            log.warning("router.unload_failed", model=model, reason=str(err))
            return False
        ok = status == 200 and isinstance(body, dict) and bool(body.get("success"))
        if not ok:
            log.warning("router.unload_refused", model=model, status=status, body=str(body)[:200])
        return ok

    def slot_action(self, model: str, slot: int, action: str, filename: str) -> dict[str, Any]:
        """POST /slots/{slot}?action=save|restore for ``model`` (never loading it): the child's
        answer ({"n_saved", "n_written", ...} or {"n_restored", "n_read", ...}); RouterError
        when the router or the child refuses it (no --slot-save-path, the model not running)."""
        path = f"/slots/{int(slot)}?action={action}&autoload=false"
        status, body = self.request("POST", path, {"model": model, "filename": filename})
        if status != 200 or not isinstance(body, dict):
            error = body.get("error") if isinstance(body, dict) else None
            said = error.get("message") if isinstance(error, dict) else str(body)[:200]
            raise RouterError(
                f"the router answered {status} to {action} of {model!r} slot {slot}: {said}"
                f" ({self.url}{path})"
            )
        return body


def slot_file(model: str, slot: int) -> str:
    """The file a model's slot is saved as in the --slot-save-path all the router's children
    share: one name per (model, slot), overwritten at each save (the directory holds at most
    one file per slot of each model); only characters llama.cpp's fs_validate_filename takes,
    the alias's CRC keeping two aliases that read the same apart."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in model)
    return f"governor-{safe[:96]}-{crc32(model.encode('utf-8', 'surrogatepass')):08x}-{slot}.bin"


def idle_slots(slots: list[dict[str, Any]]) -> list[int]:
    """The ids of the slots worth saving: not processing, and holding a conversation (a task
    served: ``id_task``; server-context.cpp to_json)."""
    return [
        s["id"]
        for s in slots
        if isinstance(s.get("id"), int) and not s.get("is_processing") and "id_task" in s
    ]


def fresh_slots(slots: list[dict[str, Any]]) -> set[int]:
    """The ids of the slots a restore may fill: never served a task, not processing."""
    return {
        s["id"]
        for s in slots
        if isinstance(s.get("id"), int) and not s.get("is_processing") and "id_task" not in s
    }


def slot_tasks(slots: list[dict[str, Any]]) -> tuple[tuple[Any, Any, bool], ...]:
    """What changes with each request a child serves: each slot's task id (its current task,
    else its previous one: server-context.cpp to_json) and whether it is processing."""
    return tuple((s.get("id"), s.get("id_task"), bool(s.get("is_processing"))) for s in slots)


def idle_lru(
    client: RouterClient,
    last: Mapping[str, float | None],
    *,
    exclude: Iterable[str] = (),
    statuses: Mapping[str, str] | None = None,
    fresh_s: float = 0.0,
    now: float | None = None,
) -> list[str]:
    """The running models with no request in flight, least recently used first (``last``:
    alias -> epoch of its last request). A model whose slots cannot be read is not idle, nor
    one whose last request is under ``fresh_s`` before ``now`` (epoch; FRESH_S)."""
    running = statuses if statuses is not None else client.models()
    skip = set(exclude)
    if fresh_s > 0:
        at = time.time() if now is None else now
        skip |= {a for a, t in last.items() if t is not None and at - t < fresh_s}
    names = [n for n, st in running.items() if st in RUNNING and st != "loading" and n not in skip]
    names.sort(key=lambda a: (last.get(a) or 0.0, a))
    return [n for n in names if client.busy(n) is False]
