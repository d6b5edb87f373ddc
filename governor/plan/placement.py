"""Where the engine's unit can be under systemd, as compiled: the installed service or a
transient scope, its cgroup U and the part of the plan the governor applies inside U.

A record shared by both lifetimes: compile time makes both places
(:func:`governor.compile.placements.compile_placements`, into the cached compiled plan); the
run time reads its own cgroup and picks one (:func:`governor.backends.placement.pick`).
Nothing is patched after the compiler.
"""

from __future__ import annotations

from typing import Literal

from governor.plan.model import Plan
from governor.record import record

Mode = Literal["service", "scope"]


@record(frozen=True)
class CompiledPlacement:
    """One place the engine's unit can be, compiled: the unit, its cgroup U and the part of the
    plan the governor applies inside U
    (:func:`governor.compile.placements.delegated_plan`)."""

    mode: Mode
    unit: str
    cgroup: str
    plan: Plan
