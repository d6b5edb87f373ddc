"""A verb plugs in by a module and one registry entry (issue 32): the policy parser accepts it,
the monitor makes its handler for the plan's rules and drives its whole lifecycle (run at a
firing, observe before the rules, tick until its rules are quiet, close when the monitor
stops, totals for the state) without the loop naming it. ``plug`` stands for a plug-in
verb (the router's ``unload`` of issue 38 is a registered one since: its own name here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from governor.backends.cgroupfs import CgroupfsBackend
from governor.compile.compiler import watch_rule
from governor.kernel import files
from governor.kernel.procfs import ProcFs
from governor.monitor.actions import registry
from governor.monitor.actions.base import Context, Env, Handler, Result, Ticked
from governor.monitor.loop import Monitor
from governor.monitor.sources import Board
from governor.plan.model import Action, WatchCondition
from governor.policy.values import parse_action
from governor.record import replace

from .fakekernel import FakeKernelCgroupFs
from .plans import GROUP, make_plan

CALLS: list[tuple[Any, ...]] = []


class Unload(Handler):
    """Takes the model out at a firing, puts it back once its rules are quiet."""

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.unloaded = 0
        self.out = False
        CALLS.append(("made", env.group))

    def run(self, action: Action, ctx: Context) -> Result:
        CALLS.append(("run", str(action), ctx.rule))
        self.unloaded += 1
        self.out = True
        return Result(str(action), ok=True, after={"model": "a"})

    def ends_firing(self, action: Action, res: Result) -> bool:
        return True  # the rule's `log` after it never runs

    def observe(self, now: float, fired: set[int], *, sampled: bool) -> None:
        CALLS.append(("observe", now))

    def tick(self, now: float, quiet: Callable[[float], bool]) -> Ticked | None:
        CALLS.append(("tick", now))
        if not self.out or not quiet(60.0):  # the rule's cooldown (2 s) counts, not 60 s
            return None
        self.out = False
        return Ticked(Result("reload", ok=True, after={"model": "a"}), "unload quiet", True)

    def close(self, why: str) -> None:
        CALLS.append(("close", why))

    def totals(self) -> dict[str, list[dict[str, Any]]]:
        return {"unload_totals": [{"model": "a", "count": self.unloaded}]}


@pytest.fixture
def unload() -> Iterator[None]:
    CALLS.clear()
    registry.register(registry.Verb("plug", "none", f"{__name__}:Unload", "`plug`"))
    try:
        yield
    finally:
        registry.unregister("plug")


def test_a_registered_verb_runs_through_the_loop_with_its_whole_lifecycle(
    unload: None, fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    oom = WatchCondition(condition="event", event="oom_kill", file="memory.events")
    plan = replace(make_plan(), watch=(watch_rule(0, oom, ("plug", "log"), cooldown_s=2.0),))
    CgroupfsBackend(fake_fs).apply(plan)
    now = [0.0]
    env = Env(
        fake_fs, plan, engine_pids=lambda: [1], board=Board(ProcFs(tmp_path)), clock=lambda: now[0]
    )
    mon = Monitor(env).start()
    assert CALLS == [("made", GROUP)]  # made for the plan's rule, before any firing
    mon.dispatch()
    assert ("observe", 0.0) in CALLS and ("tick", 0.0) in CALLS and not mon.recent
    now[0] = 1.0
    (fake_fs.path(GROUP) / files.MEMORY_EVENTS).write_text("max 1\noom 1\noom_kill 1\n")
    mon.dispatch()
    assert ("run", "plug", 0) in CALLS
    (fired,) = mon.recent
    assert [a["action"] for a in fired["actions"]] == ["plug"]  # ends_firing: no `log`
    now[0] = 2.0
    mon.dispatch()
    assert len(mon.recent) == 1  # not quiet yet: its cooldown is 2 s
    now[0] = 3.5
    mon.dispatch()
    back = mon.recent[-1]
    assert (back["rule"], back["when"], back["actions"][0]["action"]) == (
        -1,
        "unload quiet",
        "reload",
    )
    assert mon.totals() == {"unload_totals": [{"model": "a", "count": 1}]}
    assert mon.action_totals() == [{"rule": 0, "action": "plug", "count": 1}]
    mon.finish()
    assert CALLS[-1] == ("close", "monitor stopped")
    assert sum(c[0] == "made" for c in CALLS) == 1  # one handler for the monitor's life


def test_the_policy_knows_a_verb_exactly_while_it_is_registered(unload: None) -> None:
    assert str(parse_action("plug")) == "plug"
    with pytest.raises(ValueError, match="takes no argument"):
        parse_action("plug all")
    registry.unregister("plug")
    with pytest.raises(ValueError, match=r"unknown action 'plug' .*\(known: log, signal, "):
        parse_action("plug")
