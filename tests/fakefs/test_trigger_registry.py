"""A trigger plugs in by a module and one row of governor/monitor/triggers.py (issue 44 item 2):
``current > SIZE`` (the group's memory.current above a size), registered by this test alone,
is parsed, compiled, sampled by the monitor loop from the source its row names and fires as a
level rule, once per episode, without the loop, the sources or the rule engine naming it;
``swap free < SIZE`` brings its own source (a sampler of /proc/meminfo SwapFree), read only for
a plan with such a rule; and a built-in leak rule gets its slope detector through the table
(loaded only for such a rule).

Needs: a tmp directory (a fake cgroup tree and a fake /proc)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from governor.backends.cgroupfs import CgroupfsBackend
from governor.compile.compiler import _watch_trigger, watch_rule
from governor.kernel import files
from governor.kernel.procfs import ProcFs
from governor.monitor import triggers
from governor.monitor.actions.base import Env
from governor.monitor.loop import Monitor
from governor.monitor.rules import Observations, Rule, Verdict
from governor.monitor.sources import Board
from governor.plan.model import WatchCondition
from governor.policy import values as v
from governor.record import replace

from .fakekernel import FakeKernelCgroupFs
from .plans import GROUP, make_plan

# ------------------------------------------------------------------ the trigger's module

_CURRENT_RE = re.compile(r"^\s*current\s*>\s*(?P<size>\S+)\s*$")


@dataclass(frozen=True)
class CurrentAbove:
    above: int

    def __str__(self) -> str:
        return f"current > {v.format_bytes(self.above)}"


def parse_current(value: str) -> CurrentAbove:
    if not (m := _CURRENT_RE.match(value)):
        raise ValueError(f"cannot parse {value!r} (form: 'current > 512M')")
    return CurrentAbove(v.parse_size(m["size"], allow=frozenset({"bytes"})).bytes)


class CurrentCompile:
    @staticmethod
    def watch(when: CurrentAbove, site: Any) -> WatchCondition:
        return WatchCondition(condition="current", threshold=when.above, file="memory.current")

    @staticmethod
    def text(t: WatchCondition) -> str:
        return str(CurrentAbove(t.threshold))


def current_evidence(rule: Rule, st: Any, now: float, obs: Observations) -> Verdict:
    if obs.current is None:
        return False, None, False
    above = obs.current > rule.threshold
    return above, obs.current, not above


CURRENT = triggers.Trigger(
    "current",
    r"current\b",
    f"{__name__}:parse_current",
    f"{__name__}:CurrentCompile",
    "'current > 512M' (the group's memory.current)",
    "level",
    ("current",),
    f"{__name__}:current_evidence",
    "current > {threshold}",
)


@pytest.fixture
def current() -> Iterator[None]:
    triggers.register(CURRENT)
    try:
        yield
    finally:
        triggers.unregister(CURRENT.kind)


def test_a_registered_trigger_fires_in_the_monitor_loop(
    current: None, fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    when = v.parse_condition("current > 1M")
    assert when == CurrentAbove(1 << 20)  # type: ignore[comparison-overlap]  # a registered kind: outside the built-in Condition union
    rule = watch_rule(0, _watch_trigger(when), ("log",))
    assert rule.when == "current > 1MiB" and rule.trigger.text() == "current > 1048576"  # type: ignore[union-attr]  # a WatchCondition
    plan = replace(make_plan(), watch=(rule,))
    CgroupfsBackend(fake_fs).apply(plan)
    now = [0.0]
    mon = Monitor(
        Env(
            fake_fs,
            plan,
            engine_pids=lambda: [1],
            board=Board(ProcFs(tmp_path)),
            clock=lambda: now[0],
        )
    ).start()
    usage = [512 << 10, 2 << 20, 3 << 20, 512 << 10, 4 << 20]  # two episodes above 1 MiB
    for step, n in enumerate(usage):
        now[0] = float(step)
        (fake_fs.path(GROUP) / files.MEMORY_CURRENT).write_text(f"{n}\n")
        mon.dispatch()
    out = mon.finish()
    assert [(f["t_s"], f["value"]) for f in out["firings"]] == [(1.0, 2 << 20), (4.0, 4 << 20)]


def test_a_leak_rule_gets_its_detector_through_the_table(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    """The loop makes the slope's detector from the leak row's source (loaded on first use):
    anon memory growing 2 MiB/s fires `leak > 1M/s for 10s` once its window is covered."""
    rule = watch_rule(0, _watch_trigger(v.parse_condition("leak > 1M/s for 10s")), ("log",))
    plan = replace(make_plan(), watch=(rule,))
    CgroupfsBackend(fake_fs).apply(plan)
    now = [0.0]
    mon = Monitor(
        Env(
            fake_fs,
            plan,
            engine_pids=lambda: [1],
            board=Board(ProcFs(tmp_path)),
            clock=lambda: now[0],
        )
    ).start()
    for step in range(16):
        now[0] = float(step)
        anon = (64 << 20) + step * (2 << 20)
        (fake_fs.path(GROUP) / files.MEMORY_STAT).write_text(f"anon {anon}\nfile 0\n")
        mon.dispatch()
    out = mon.finish()
    (fired,) = out["firings"]  # one episode: once without a cooldown
    assert 9.0 <= fired["t_s"] <= 12.0 and fired["value"] == float(2 << 20)


# ------------------------------------------------------------------ a trigger with its own source
# `swap free < SIZE`: /proc/meminfo SwapFree, which no built-in source reads; its module adds
# the sampler with the row


@dataclass(frozen=True)
class SwapFreeBelow:
    below: int

    def __str__(self) -> str:
        return f"swap free < {v.format_bytes(self.below)}"


def parse_swap_free(value: str) -> SwapFreeBelow:
    if not (m := re.match(r"^\s*swap\s+free\s*<\s*(?P<size>\S+)\s*$", value)):
        raise ValueError(f"cannot parse {value!r} (form: 'swap free < 64M')")
    return SwapFreeBelow(v.parse_size(m["size"], allow=frozenset({"bytes"})).bytes)


class SwapFreeCompile:
    @staticmethod
    def watch(when: SwapFreeBelow, site: Any) -> WatchCondition:
        return WatchCondition(condition="swap_free", threshold=when.below, file="/proc/meminfo")

    @staticmethod
    def text(t: WatchCondition) -> str:
        return str(SwapFreeBelow(t.threshold))


def sample_swap_free(fs: Any, group: str, proc: ProcFs) -> int | None:
    return proc.meminfo().get("SwapFree")


def swap_free_evidence(rule: Rule, st: Any, now: float, obs: Observations) -> Verdict:
    got = obs.extra.get("swap_free")
    if got is None:
        return False, None, False
    below = got < rule.threshold
    return below, got, not below


SWAP_FREE = triggers.Trigger(
    "swap_free",
    r"swap\s+free",
    f"{__name__}:parse_swap_free",
    f"{__name__}:SwapFreeCompile",
    "'swap free < 64M' (/proc/meminfo SwapFree)",
    "level",
    ("swap_free",),
    f"{__name__}:swap_free_evidence",
    "swap free < {threshold}",
)


@pytest.fixture
def swap_free() -> Iterator[None]:
    triggers.register(SWAP_FREE)
    triggers.register_source("swap_free", f"{__name__}:sample_swap_free")
    try:
        yield
    finally:
        triggers.unregister(SWAP_FREE.kind)
        triggers.unregister_source("swap_free")


def test_a_registered_trigger_with_its_own_source_fires_in_the_monitor_loop(
    swap_free: None, fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    rule = watch_rule(0, _watch_trigger(v.parse_condition("swap free < 64M")), ("log",))
    assert rule.when == "swap free < 64MiB"
    plan = replace(make_plan(), watch=(rule,))
    CgroupfsBackend(fake_fs).apply(plan)
    now = [0.0]
    mon = Monitor(
        Env(
            fake_fs,
            plan,
            engine_pids=lambda: [1],
            board=Board(ProcFs(tmp_path)),
            clock=lambda: now[0],
        )
    ).start()
    for step, free_kib in enumerate([512 << 10, 100 << 10, 32 << 10, 16 << 10, 200 << 10]):
        now[0] = float(step)
        (tmp_path / "meminfo").write_text(f"MemTotal: 2048000 kB\nSwapFree: {free_kib} kB\n")
        mon.dispatch()
    out = mon.finish()
    assert [(f["t_s"], f["value"]) for f in out["firings"]] == [(2.0, 32 << 20)]


def test_a_plan_without_the_plugin_source_does_not_sample_it(
    swap_free: None, fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    mon = Monitor(Env(fake_fs, make_plan(), engine_pids=lambda: [1], board=Board(ProcFs(tmp_path))))
    assert mon.levels.samplers == {}
