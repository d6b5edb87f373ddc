"""A PSI trigger as the policy spells it: ``[board|system] <memory|cpu|io> <some|full>
<stall>/<window>``, parsed (the ``psi`` row of governor/monitor/triggers.py). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from governor.policy.durations import Duration, parse_duration

# Kernel limits for PSI trigger windows (Documentation/accounting/psi.rst).
PSI_WINDOW_MIN_US = 500_000
PSI_WINDOW_MAX_US = 10_000_000
_TRIGGER_RE = re.compile(
    r"^\s*(?:(?P<scope>system|board)\s+)?(?P<res>memory|cpu|io)\s+(?P<kind>some|full)\s+"
    r"(?P<stall>\S+)\s*/\s*(?P<window>\S+)\s*$"
)


@dataclass(frozen=True)
class PsiTrigger:
    resource: Literal["memory", "cpu", "io"]
    kind: Literal["some", "full"]
    stall: Duration
    window: Duration
    # "system memory some ...": the whole board's pressure (/proc/pressure/memory, which is
    # the root cgroup's memory.pressure), not the slice's; "board memory some ..." is the same
    # (the QoS spelling, issue 23), kept as written
    system: bool = False
    scope: Literal["system", "board"] = "system"

    def __str__(self) -> str:
        scope = f"{self.scope} " if self.system else ""
        return f"{scope}{self.resource} {self.kind} {self.stall}/{self.window}"


def parse_trigger(value: object) -> PsiTrigger:
    """ "memory some 150ms/2s" -> PsiTrigger. Window 500ms..10s, 0 < stall <= window."""
    if isinstance(value, PsiTrigger):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a trigger like 'memory some 150ms/2s', got {value!r}")
    m = _TRIGGER_RE.match(value)
    if not m:
        raise ValueError(
            f"cannot parse trigger {value!r} (form: '[board|system] <memory|cpu|io> <some|full>"
            " <stall>/<window>', e.g. 'memory some 150ms/2s')"
        )
    stall, window = parse_duration(m["stall"]), parse_duration(m["window"])
    if not PSI_WINDOW_MIN_US <= window.us <= PSI_WINDOW_MAX_US:
        raise ValueError(f"trigger window {window} is outside the kernel's 500ms..10s ({value!r})")
    if stall.us > window.us:
        raise ValueError(f"trigger stall {stall} is longer than its window {window} ({value!r})")
    if m["res"] == "cpu" and m["kind"] == "full" and not m["scope"]:
        # cpu "full" exists since 5.13 at the system level only; it is always 0 for cgroups
        raise ValueError(
            f"'cpu full' is not a meaningful cgroup trigger ({value!r}); use 'cpu some'"
        )
    return PsiTrigger(
        m["res"],  # type: ignore[arg-type]  # regex
        m["kind"],  # type: ignore[arg-type]  # regex
        stall,
        window,
        system=bool(m["scope"]),
        scope=m["scope"] or "system",  # type: ignore[arg-type]  # regex
    )
