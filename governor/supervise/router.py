"""llama-server's router as the governor talks to it (issue 38 items 3 and 4): which models are
loaded, whether one has a request in flight, each model's last request, and unloading one.

- ``GET /models``: every model with ``status.value`` (unloaded, loading, loaded, sleeping,
  ...) (tools/server/server-models.cpp, the build of notes/engine.md);
- ``GET /slots?model=NAME&autoload=false``: the child's slots, proxied by the router without
  loading a model that is not running (``autoload=false``; a GET never moves the router's own
  ``last_used``); a slot with ``is_processing`` true is a request in flight. A child started
  with ``--no-slots`` answers an error: its in-flight state is unknown (None);
- ``POST /models/unload {"model": NAME}``: the router stops that child at once (it exits
  within the preset's ``stop-timeout``, 10 s by default).

The router keeps its own least-recently-used time (``meta.last_used``) but publishes it
nowhere, so the governor keeps its own: :class:`Activity` reads each model leaf's
``cpu.stat`` ``usage_usec`` (present in every cgroup v2 group, with or without the cpu
controller) every 0.5 s; a leaf that used more than ``BUSY_USEC`` of CPU since is asked for
its slots, and a slot's new task (or one in flight) dates the model's last request: CPU alone
is no request (a probe of its slots by a shedder costs the child CPU; so does housekeeping
that TCG inflates: a CI guest run unloaded the model used last, not the idle one). A model's
load is its first request.

Standard library only (the run time's import set): each call is one exchange of
governor/peer/http.py (a deadline for the whole request, a body cap), as ready.py's probe.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from governor.errors import GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import (
    LeafNameError,
    leaf_name,
    model_cgroup,
    model_name,
)
from governor.kernel.modelleaves import model_leaves
from governor.log import get_logger
from governor.peer import http

log = get_logger(__name__)

TIMEOUT_S = 5.0  # one whole request to the router (it answers /models and /slots at once)
BUSY_USEC = 2000  # CPU a model leaf used between two samples that counts as a request
# the router's status values of a model that holds memory (server_model_status_to_string)
RUNNING = frozenset({"loading", "loaded", "sleeping"})


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


def slot_tasks(slots: list[dict[str, Any]]) -> tuple[tuple[Any, Any, bool], ...]:
    """What changes with each request a child serves: each slot's task id (its current task,
    else its previous one: server-context.cpp to_json) and whether it is processing."""
    return tuple((s.get("id"), s.get("id_task"), bool(s.get("is_processing"))) for s in slots)


class Activity:
    """Each model's last request (epoch seconds), from its leaf's CPU use (module docstring).
    ``sample`` is one look at every model leaf; ``touch`` dates a model now (its load).

    With a ``client``, CPU alone does not date a request: a leaf that used ``busy_usec`` is
    asked for its slots, and only a slot's new task (or one processing) dates it; CPU the
    child spent otherwise (another governor's probe of its slots, its own housekeeping,
    which TCG inflates) leaves its last request where it was. Slots that cannot be read fall
    back to the CPU."""

    def __init__(
        self,
        fs: CgroupFs,
        group: str,
        *,
        clock: Callable[[], float] = time.time,
        busy_usec: int = BUSY_USEC,
        client: RouterClient | None = None,
    ) -> None:
        self.fs = fs
        self.group = group
        self.clock = clock
        self.busy_usec = busy_usec
        self.client = client
        self.last: dict[str, float] = {}  # alias -> epoch of its last request
        self.leaves: dict[str, str] = {}  # leaf name -> alias, of every model touched
        self._usage: dict[str, int] = {}  # alias -> usage_usec at the previous sample
        self._tasks: dict[str, tuple[tuple[Any, Any, bool], ...]] = {}  # alias -> slot_tasks

    def touch(self, alias: str, when: float | None = None) -> None:
        self.last[alias] = self.clock() if when is None else when
        with contextlib.suppress(LeafNameError):  # no leaf: never sampled
            self.leaves[leaf_name(alias)] = alias

    def model_of(self, leaf: str) -> str:
        """The model a leaf under ``models/`` belongs to: the one placed there in this run,
        else the name the leaf reads back as (kernel/leafname.py), else the leaf's own name."""
        return self.leaves.get(leaf) or model_name(leaf) or leaf

    def sample(self) -> bool:
        """Read every model leaf's usage_usec; True when a model's last request moved."""
        now = self.clock()
        moved = False
        for cg, leaf in model_leaves(self.fs, self.group):
            alias = self.model_of(leaf)
            try:
                usage = self.fs.cpu_stat(cg).get("usage_usec", 0)
            except GovernorError:
                continue
            before = self._usage.get(alias)
            self._usage[alias] = usage
            if before is not None and usage - before >= self.busy_usec and self._served(alias):
                self.last[alias] = now
                moved = True
        return moved

    def _served(self, alias: str) -> bool:
        """Whether the CPU ``alias`` used was a request: its slots show a new task or one in
        flight (the probe's own CPU is taken as the next base); True without a client or
        when its slots cannot be read."""
        if self.client is None:
            return True
        slots = self.client.slots(alias)
        self.rebase([alias])
        if slots is None:
            return True
        tasks = slot_tasks(slots)
        new = tasks != self._tasks.get(alias)
        self._tasks[alias] = tasks
        return new or any(busy for _id, _task, busy in tasks)

    def rebase(self, aliases: Iterable[str]) -> None:
        """Take each model leaf's usage now as the next sample's base without dating it: the
        governor's own probe of its slots (GET /slots, :func:`idle_lru`) costs its child CPU
        that is no request (a request within the last sample interval is missed with it)."""
        for alias in aliases:
            try:
                cg = model_cgroup(self.group, alias)
                self._usage[alias] = self.fs.cpu_stat(cg).get("usage_usec", 0)
            except (GovernorError, LeafNameError):
                continue

    def lru(self, aliases: Iterable[str]) -> list[str]:
        """``aliases`` least recently used first (never used: first of all, by name)."""
        return sorted(aliases, key=lambda a: (self.last.get(a, 0.0), a))


def idle_lru(
    client: RouterClient,
    last: Mapping[str, float | None],
    *,
    exclude: Iterable[str] = (),
    statuses: Mapping[str, str] | None = None,
) -> list[str]:
    """The running models with no request in flight, least recently used first (``last``:
    alias -> epoch of its last request). A model whose slots cannot be read is not idle."""
    running = statuses if statuses is not None else client.models()
    skip = set(exclude)
    names = [n for n, st in running.items() if st in RUNNING and st != "loading" and n not in skip]
    names.sort(key=lambda a: (last.get(a) or 0.0, a))
    return [n for n in names if client.busy(n) is False]
