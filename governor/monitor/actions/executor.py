"""Runs a fired rule's actions through their registered handlers (registry.py).

Each action logs ONE structured event, ``action.done`` (or ``action.failed``), with the rule,
the verb and the values before and after. Failures are logged and reported, never raised: the
monitor must keep watching and the engine must keep running.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from governor.errors import GovernorError
from governor.log import get_logger
from governor.monitor.actions import registry
from governor.monitor.actions.base import Context, Env, Handler, Result, Ticked
from governor.plan.model import Action

log = get_logger(__name__)


class Executor:
    """The handlers of one monitor: made for every verb the plan's rules name (at once, so
    their ``observe``/``tick`` run from the start), and on first use for any other."""

    def __init__(self, env: Env) -> None:
        self.env = env
        env.shared.execute = self.execute
        plan = env.plan
        self.handlers: dict[str, Handler] = {}  # by "module:Class", in the order first made
        self.rules: dict[str, list[tuple[int, float | None]]] = {}  # handler -> (rule, cooldown)
        for w in plan.watch:
            for a in w.actions:
                key = registry.VERBS[a.verb].handler
                self.handler(a.verb)
                uses = self.rules.setdefault(key, [])
                if (w.index, w.cooldown_s) not in uses:
                    uses.append((w.index, w.cooldown_s))

    @property
    def group(self) -> str:
        return self.env.group

    @property
    def thaw_at(self) -> float | None:
        return self.env.shared.thaw_at

    def handler(self, verb: str) -> Handler:
        key = registry.VERBS[verb].handler
        made = self.handlers.get(key)
        if made is None:
            made = self.handlers[key] = registry.handler_class(verb)(self.env)
        return made

    # ------------------------------------------------------------------ lifecycle

    def execute(self, action: Action, ctx: Context) -> Result:
        try:
            res = self.handler(action.verb).run(action, ctx)
        except GovernorError as err:
            res = Result(str(action), ok=False, detail=str(err))
        except (OSError, ValueError) as err:  # SubprocessError: caught by the exec handler
            res = Result(str(action), ok=False, detail=f"{type(err).__name__}: {err}")
        event = "action.done" if res.ok else "action.failed"
        (log.info if res.ok else log.warning)(
            event, rule=ctx.rule, when=ctx.when, cgroup=self.group, **res.as_dict()
        )
        return res

    def ends_firing(self, action: Action, res: Result) -> bool:
        return self.handler(action.verb).ends_firing(action, res)

    def observe(self, now: float, fired: set[int], *, sampled: bool) -> None:
        for h in list(self.handlers.values()):
            h.observe(now, fired, sampled=sampled)

    def deadline(self) -> float | None:
        times = [t for h in self.handlers.values() if (t := h.deadline()) is not None]
        return min(times, default=None)

    def tick(self, now: float, quiet: Callable[[int, float], bool]) -> list[Ticked]:
        """Every handler's tick; ``quiet(rule, cooldown_s)`` is the rule engine's."""
        out = []
        for key, h in list(self.handlers.items()):
            rules = self.rules.get(key, [])

            def all_quiet(settle_s: float, rules: list[tuple[int, float | None]] = rules) -> bool:
                return all(quiet(i, cooldown or settle_s) for i, cooldown in rules)

            done = h.tick(now, all_quiet)
            if done is not None:
                out.append(done)
        return out

    def close(self, why: str) -> None:
        for h in list(self.handlers.values()):
            h.close(why)

    def totals(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for h in self.handlers.values():
            out.update(h.totals())
        return out
