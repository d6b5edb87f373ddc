"""``unload`` (issue 38): this slice's llama-server router unloads its least recently used idle
model (no request in flight), a whole model's memory given back before anything is throttled
or frozen. The model loads again at its next request: nothing is held, nothing to give back.

Where the router is: the ``router`` of this slice's published state (governor/rundir/state.py,
its url and each model's last request, published by the launch that runs the router, or by an
attached `governor monitor`: its url, found in the engine's command line, and no model's last
request); a `governor monitor` attached to a launched router's group reads the launch's state
(the live one of the same group) for the models' last requests. Nothing idle, no router, no answer: the result is not ok, with why,
and the rule's later actions run (``do = ["unload", "freeze 5s"]`` is a ladder). Each unload is
a journal entry (source "unload", model, reason "pressure") and counted in ``totals`` as
``router_unloads`` ({"model", "reason", "count"}), which the launch's publish adds to its
router's ``unloads`` (the metric governor_model_unloads_total).

Both run in a monitor's thread, the one that evaluates its engine's rules (the shed's: a
higher class's, against a lower class's router): every call of one unload to the router ends
within ``UNLOAD_S`` in all (:func:`bounded_router`), and a router that does not answer in time
is a failed unload: the rule's later actions run, the shed's ladder takes its next step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from governor.errors import GovernorError
from governor.log import get_logger
from governor.monitor.actions.base import Context, Env, Handler, Result
from governor.peer.router import FRESH_S, RouterClient, idle_lru
from governor.plan.model import Action
from governor.rundir.state import STATE_FILE, load_state, read_states, run_dir

log = get_logger(__name__)

REASON = "pressure"
UNLOAD_S = 2.0  # all the calls of one unload (/models, each model's /slots, the unload)
TOTALS = "router_unloads"  # the published state's field ... merged into router.unloads


def bounded_router(url: str) -> RouterClient:
    """The client of one unload: each of its calls, and all of them, within UNLOAD_S."""
    return RouterClient(url, timeout=UNLOAD_S, budget_s=UNLOAD_S)


class Unload(Handler):
    def __init__(self, env: Env, router: Callable[[str], RouterClient] = bounded_router) -> None:
        super().__init__(env)
        self.router = router
        self.counts: dict[tuple[str, str], int] = {}  # (model, reason) -> unloads

    def run(self, action: Action, ctx: Context) -> Result:
        found = self._router()
        if found is None:
            return Result(
                "unload", ok=False,
                detail="not a router the governor can reach: this slice's published state"
                " has no router url (a router on a UNIX socket only publishes none)",
            )  # fmt: skip
        try:
            model = unload_lru(self.router, *found, self.env.group)
        except GovernorError as err:
            return Result("unload", ok=False, detail=str(err))
        self.counts[(model, REASON)] = self.counts.get((model, REASON), 0) + 1
        self._journal(model, ctx)
        return Result("unload", ok=True, after={"model": model, "router": found[0]})

    def totals(self) -> dict[str, list[dict[str, Any]]]:
        return {
            TOTALS: [
                {"model": m, "reason": r, "count": n} for (m, r), n in sorted(self.counts.items())
            ]
        }

    def _router(self) -> tuple[str, dict[str, float | None]] | None:
        """(url, {model: last request}) of this slice's router, or None: its own published
        state, else (attached, `governor monitor`) the live launch state of the same group."""
        env = self.env
        run = env.journal.dir.parent if env.journal is not None else run_dir()
        own = None
        with contextlib.suppress(FileNotFoundError, GovernorError):
            own = load_state(run / env.plan.policy / STATE_FILE).router_models()
            if own is not None and own[1]:
                return own
        # an attached monitor publishes its router's url but no model's last request (it
        # places no model leaves): a launch's of the same group knows them
        with contextlib.suppress(OSError):
            for st in read_states(run):
                found = None if st.stale or st.group != env.group else st.router_models()
                if found is not None and (found[1] or own is None):
                    return found
        return own

    def _journal(self, model: str, ctx: Context) -> None:
        journal = self.env.journal
        if journal is None:
            return
        try:
            with self.env.journal_locked():
                journal.append(
                    "unload", [], model=model, reason=REASON, rule=ctx.rule, when=ctx.when,
                    value=ctx.value,
                )  # fmt: skip
        except OSError as err:
            log.warning("unload.journal_failed", model=model, reason=str(err))


def unload_lru(
    router: Callable[[str], RouterClient],
    url: str | None,
    last: Mapping[str, float | None] | None,
    cgroup: str,
) -> str:
    """Unload the least recently used idle model of the router at ``url`` (``last``: each
    model's last request) and name it; GovernorError when none is idle and unloaded, or the
    router does not answer (the `unload` verb's and the shed ladder's step; ``cgroup``: the
    router's slice, for the message)."""
    if url is None:
        raise GovernorError(f"not a router: no router url published ({cgroup})")
    client = router(url)
    for model in idle_lru(client, last or {}, fresh_s=FRESH_S):
        if client.unload(model):
            return model
    raise GovernorError(f"no idle model to unload at router {url} ({cgroup})")


def merge_unloads(*lists: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Unload counts ({"model", "reason", "count"}) from several counters as one list, summed
    per (model, reason): the router's published ``unloads`` (the launch's own evictions and
    this handler's ``router_unloads``)."""
    out: dict[tuple[str, str], int] = {}
    for items in lists:
        for u in items:
            key = (str(u["model"]), str(u["reason"]))
            out[key] = out.get(key, 0) + int(u["count"])
    return [{"model": m, "reason": r, "count": n} for (m, r), n in sorted(out.items())]
