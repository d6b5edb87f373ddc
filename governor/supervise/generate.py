"""Alive means it generates (issue 46 item 5): llama-server's /health answers 200 while a load
path or a slot is stuck, and a supervisor that asks only /health keeps a dead server up (Ollama
sat dead 5.5 h with a green health check, ollama#17408). With ``[engine] probe_generate`` the
supervisor asks the ready server for ONE token every interval: ``POST /v1/completions`` with
``max_tokens`` 1 (llama-server's OpenAI-compatible route; ``n_predict`` 1 for its native
parser), through governor/peer/http.py with the interval as the whole request's deadline and a
small body cap, on its own thread (never the monitor's, which evaluates the rules).

:data:`FAILS` failed probes in a row (no 200 within the deadline, nothing answered, a trickle
or a flood) make the engine unresponsive: the supervisor journals it and stops the engine,
with a relaunch while ``restart_max`` allows one, else the launch fails (69) as a server that
never became ready does (supervise/ready.py). One slow answer is no failure of the server:
with ``-np 1`` the probe waits behind a long generation, hence several in a row, and a failed
probe whose server shows a slot that decoded tokens since the last look (``GET /slots``:
``n_decoded`` of each processing slot) is busy, not stuck: it does not count.

Off by default: each probe is a generation on a small board's cores, and with one slot it
replaces that slot's cached prompt (an idle conversation's next turn re-reads its prompt).
Not for llama-server's router either: a completion there loads a model. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from governor.log import get_logger
from governor.peer import http
from governor.supervise.ready import EngineNotReady

if TYPE_CHECKING:
    from governor.monitor.restart import Restarts
    from governor.rundir.journal import Journal
    from governor.supervise.ready import Endpoint

log = get_logger("governor.launch")

PATH = "/v1/completions"
BODY = json.dumps({"prompt": "ok", "max_tokens": 1, "n_predict": 1, "stream": False}).encode()
CAP = 64 << 10  # one token's answer (llama-server adds its timings): a few hundred bytes
SLOTS_CAP = 1 << 20  # GET /slots: each slot's parameters, a few KiB a slot
SLOTS_S = 2.0  # at most this long for GET /slots after a failed probe
FAILS = 3  # failed probes in a row before the engine counts as unresponsive
WHEN = "probe_generate"  # the relaunch's "when" and the journal's source

Exchange = Callable[..., http.Answer]


def progress(
    ep: Endpoint, deadline_s: float, exchange: Exchange = http.exchange
) -> tuple[tuple[object, ...], ...] | None:
    """What moves while a slot generates: (id, id_task, n_decoded) of each processing slot
    (``GET /slots``); None when no slot is processing or they cannot be read (--no-slots, no
    answer): then a failed probe counts."""
    try:
        answer = exchange(ep.host, ep.port, "GET", "/slots", deadline_s=deadline_s, cap=SLOTS_CAP)
        slots = json.loads(answer.body) if answer.status == 200 else None
    except (http.HttpError, ValueError):
        return None
    if not isinstance(slots, list):
        return None
    busy = []
    for slot in slots:
        if isinstance(slot, dict) and slot.get("is_processing"):
            token = slot.get("next_token")
            token = token[0] if isinstance(token, list) and token else token
            decoded = token.get("n_decoded") if isinstance(token, dict) else None
            busy.append((slot.get("id"), slot.get("id_task"), decoded))
    return tuple(busy) or None


def ask(ep: Endpoint, deadline_s: float, exchange: Exchange = http.exchange) -> str | None:
    """One probe: None when the server answered 200 within ``deadline_s`` in all, else what
    went wrong (one line)."""
    try:
        answer = exchange(
            ep.host, ep.port, "POST", PATH, deadline_s=deadline_s, body=BODY,
            content_type="application/json", cap=CAP,
        )  # fmt: skip
    except http.HttpError as err:
        return err.problem
    if answer.status != 200:
        return f"it answered {answer.status}"
    return None


class GenerateProbe:
    """Ask ``ep`` for one token every ``interval_s`` (the first one interval after
    :meth:`start`) until :meth:`stop`, or until :data:`FAILS` probes in a row failed: then
    ``on_unresponsive(why)`` once, and the probe ends (the relaunched engine gets a new one
    once it is ready)."""

    def __init__(
        self,
        ep: Endpoint,
        interval_s: float,
        *,
        on_unresponsive: Callable[[str], None],
        fails: int = FAILS,
        exchange: Exchange = http.exchange,
    ) -> None:
        self.ep, self.interval_s, self.fails = ep, interval_s, fails
        self.on_unresponsive = on_unresponsive
        self.exchange = exchange
        self.failed = 0  # probes in a row that failed
        self.seen: tuple[tuple[object, ...], ...] | None = None  # the slots' last progress
        self.asked = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-generate", daemon=True)

    @property
    def url(self) -> str:
        return f"{self.ep.url.rsplit(self.ep.path, 1)[0]}{PATH}"

    def start(self) -> GenerateProbe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval_s + 1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            why = ask(self.ep, self.interval_s, self.exchange)
            self.asked += 1
            if self._stop.is_set():
                return  # stopped while it asked: the engine is going anyway
            if why is None:
                self.failed = 0
                continue
            # a slot that decoded tokens since the last look is busy, not stuck: with -np 1
            # a long generation holds the probe past its deadline (not a failure)
            moved = progress(self.ep, min(self.interval_s, SLOTS_S), self.exchange)
            busy, self.seen = moved is not None and moved != self.seen, moved
            if busy:
                log.info("engine.probe_busy", url=self.url, why=why)
                continue
            self.failed += 1
            log.warning("engine.probe_failed", url=self.url, why=why, in_a_row=self.failed)
            if self.failed >= self.fails:
                self.on_unresponsive(
                    f"{self.url} gave no token within {self.interval_s:g}s {self.failed} times"
                    f" in a row ({why}; engine.probe_generate)"
                )
                return


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a pidfd: nothing is signalled)."""
    try:
        os.close(os.pidfd_open(pid))
    except ProcessLookupError:
        return False
    except OSError:
        return True  # not ours to tell (EMFILE, ENOSYS): it may run
    return True


def unresponsive(
    pid: int,
    why: str,
    *,
    restarts: Restarts | None,
    journal: Journal | None,
    stop_engine: Callable[[int], str],
) -> str | None:
    """What the supervisor does with an unresponsive engine ``pid``: journal it, then stop it
    with a relaunch requested when ``restarts`` allows one. Returns None when it will be
    relaunched, else why the launch fails (the engine was stopped)."""
    if not alive(pid):
        return None  # it exited by itself meanwhile: the launcher has its status
    refusal = None if restarts is None else restarts.refusal()
    relaunch = restarts is not None and refusal is None
    log.error("engine.unresponsive", pid=pid, why=why, relaunch=relaunch)
    if journal is not None:
        with contextlib.suppress(OSError):
            journal.append(WHEN, [], reason=why, step="restart" if relaunch else "stop")
    if restarts is not None and relaunch:
        restarts.request(-1, WHEN)
        stop_engine(pid)
        return None
    sent = stop_engine(pid)
    return f"{why}; it was stopped ({sent}{'; ' + refusal if refusal else ''})"


def unresponsive_error(why: str, code: int) -> EngineNotReady:
    """What the launch fails with (69) once the probe stopped an engine with no relaunch
    left: the probe's key and hint, not a never-ready engine's ready_timeout."""
    return EngineNotReady(
        f"engine unresponsive: {why}, exit {code} (engine.probe_generate)",
        hint="see the engine's log for where it hung; raise engine.probe_generate on a slow"
        " board, or process.restart_max for more relaunches",
    )
