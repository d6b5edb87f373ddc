"""The built-in trigger kinds compiled (issue 44 item 2): one class per row of
governor/monitor/triggers.py, each with ``watch`` (the policy's condition -> what the monitor
arms or reads, plan/model.py) and ``text`` (the compiled condition back in the policy's
spelling, the monitor's ``when`` when the policy's own is not at hand). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from governor.compile.headroom import headroom_condition
from governor.compile.thrash import refault_text, refault_watch
from governor.errors import PolicyError
from governor.kernel import files as kf
from governor.plan.model import CgroupWrite, WatchCondition, WatchTrigger
from governor.policy import values as v
from governor.policy.durations import Duration
from governor.policy.refaults import BoardFileCondition


@dataclass(frozen=True)
class Site:
    """Where a rule's condition is compiled: its index in [[pressure]], the plan's cgroup writes
    (a headroom rule's peak claim), the policy file and the engine's model size (``board file <
    model``); None where no plan is at hand."""

    index: int
    writes: Sequence[CgroupWrite]
    source: str | None
    model_bytes: int | None = None


def _window(seconds: float | None) -> Duration:
    return Duration(int((seconds or 0) * 1e6))


class Psi:
    @staticmethod
    def watch(when: v.PsiTrigger, site: Site | None) -> WatchTrigger:
        return WatchTrigger(
            resource=when.resource,
            kind=when.kind,
            stall_us=when.stall.us,
            window_us=when.window.us,
            file=f"{when.resource}.pressure",
            system=when.system,
        )

    @staticmethod
    def text(t: Any) -> str:
        return f"{t.resource} {t.kind} {Duration(t.stall_us)}/{Duration(t.window_us)}"


class Leak:
    @staticmethod
    def watch(when: v.LeakCondition, site: Site | None) -> WatchCondition:
        return WatchCondition(
            condition="leak",
            threshold=when.rate,
            window_s=when.window.seconds,
            file=kf.MEMORY_STAT,
        )

    @staticmethod
    def text(t: WatchCondition) -> str:
        return f"leak > {v.format_bytes(t.threshold)}/s for {_window(t.window_s)}"


class MemAvailable:
    """``memavailable < SIZE``, and ``board available < SIZE``: MemAvailable less the page
    cache the group's memory.min protects."""

    @staticmethod
    def watch(when: v.MemAvailableCondition, site: Site | None) -> WatchCondition:
        kind = "available" if when.board else "memavailable"
        return WatchCondition(condition=kind, threshold=when.below, file="/proc/meminfo")

    @staticmethod
    def text(t: WatchCondition) -> str:
        name = "board available" if t.condition == "available" else "memavailable"
        return f"{name} < {v.format_bytes(t.threshold)}"


class Headroom:
    """The peak claim: compile/headroom.py (refused without memory.max or memory.high)."""

    @staticmethod
    def watch(when: v.HeadroomCondition, site: Site | None) -> WatchCondition:
        if site is None:  # no plan at hand: the claim comes with it
            return WatchCondition(condition="headroom", file="/proc/meminfo")
        return headroom_condition(site.index, site.writes, site.source)

    @staticmethod
    def text(t: WatchCondition) -> str:
        return "board available < headroom"


class BoardFile:
    """``board file < model``: the model's size (the files the engine's command line names) is
    the floor; refused, like ``memory.min = "model"``, without the engine's command line."""

    @staticmethod
    def watch(when: BoardFileCondition, site: Site | None) -> WatchCondition:
        below = when.below
        if below is None and site is not None:
            below = site.model_bytes
            if below is None:
                raise PolicyError(
                    f"pressure[{site.index}].when = {str(when)!r} needs the model file;"
                    " give the engine command line",
                    file=site.source,
                    field=f"pressure[{site.index}].when",
                    hint="governor launch --policy P -- ENGINE -m MODEL ..., or a size like"
                    " 'board file < 1.2G'",
                )
        return WatchCondition(condition="board_file", threshold=below or 0, file="/proc/meminfo")

    @staticmethod
    def text(t: WatchCondition) -> str:
        return f"board file < {v.format_bytes(t.threshold)}"


class Device:
    @staticmethod
    def watch(when: v.DeviceMemoryCondition, site: Site | None) -> WatchCondition:
        return WatchCondition(condition="device", threshold=when.above, file="/proc/PID/fdinfo")

    @staticmethod
    def text(t: WatchCondition) -> str:
        return f"device memory > {v.format_bytes(t.threshold)}"


class Refaults:
    """``[board] refaults > P%/W``: compile/thrash.py."""

    @staticmethod
    def watch(when: Any, site: Site | None) -> WatchCondition:
        return refault_watch(when)

    @staticmethod
    def text(t: WatchCondition) -> str:
        return refault_text(t)


class Event:
    @staticmethod
    def watch(when: v.EventCondition, site: Site | None) -> WatchCondition:
        return WatchCondition(condition="event", event=when.event, file=kf.MEMORY_EVENTS)

    @staticmethod
    def text(t: WatchCondition) -> str:
        return str(t.event)
