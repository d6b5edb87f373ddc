"""``shed``: take memory from slices of a lower QoS class (issue 23; the ladder and its undo in
shedder.py). This handler gives the shedder its lifecycle: ``run`` takes a step at each firing,
``observe`` drops the board firings that are only the held victims' own stall
(governor/monitor/ownstall.py), ``tick`` undoes a step once every shedding rule has been quiet
for its cooldown, ``close`` gives everything back, ``totals`` counts steps per victim (the
metric governor_shed_total)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from governor.monitor.actions.base import Context, Env, Handler, Result, Ticked
from governor.monitor.actions.shedder import Shedder
from governor.monitor.ownstall import OwnStall
from governor.plan.model import Action
from governor.rundir.state import run_dir


class Shed(Handler):
    def __init__(self, env: Env, shedder: Shedder | None = None) -> None:
        super().__init__(env)
        if shedder is None:
            run = env.journal.dir.parent if env.journal is not None else run_dir()
            shedder = Shedder(
                env.fs, env.plan, run=run, watchdog=env.watchdog, clock=env.clock,
                memavailable=env.board.memavailable if env.board is not None else None,  # a raise of the undo grows a victim into it
            )  # fmt: skip
        self.shedder = shedder
        rules = {w.index for w in env.plan.watch if any(a.verb == "shed" for a in w.actions)}
        self.own_stall = OwnStall.of(env.fs, env.plan, rules)

    def run(self, action: Action, ctx: Context) -> Result:
        return self.shedder.shed(ctx)

    def observe(self, now: float, fired: set[int], *, sampled: bool) -> None:
        self.own_stall.discount(now, fired, self.shedder.held_groups(), sampled=sampled)

    def tick(self, now: float, quiet: Callable[[float], bool]) -> Ticked | None:
        sh = self.shedder
        if not sh.holding() or not quiet(sh.settle_s):
            return None
        done = sh.undo()
        return None if done is None else Ticked(done, "shed quiet", publish=True)

    def close(self, why: str) -> None:
        if self.shedder.holding():  # never leave another slice shed behind
            self.shedder.release_all(why)

    def totals(self) -> dict[str, list[dict[str, Any]]]:
        return {"shed_totals": self.shedder.totals_list()}
