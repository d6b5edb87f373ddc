"""Durations as a policy spells them (``150ms``, ``2s``, ``1m``) and as an operator types them on
the command line (``--confirm 90``, ``1m30s``): one unit table for both."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from governor.errors import shown as _shown
from governor.sizes import duration_text

# the longest number text a parser looks at (a longer one is refused, not parsed)
MAX_DIGITS = 40

_DURATION_RE = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>us|ms|s|m|h)\s*$")
DURATION_MAX_US = 366 * 86_400 * 1_000_000  # sleeps and timers past a year are a typo
_DURATION_US = {"us": 1, "ms": 1000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000}


@dataclass(frozen=True)
class Duration:
    us: int

    @property
    def seconds(self) -> float:
        return self.us / 1_000_000

    def __str__(self) -> str:
        return duration_text(self.us)


def parse_duration(value: object) -> Duration:
    """ "150ms", "2s", "1.5s", "1m" -> Duration. Units are required (no bare numbers)."""
    if isinstance(value, Duration):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a duration string like '150ms' or '2s', got {value!r}")
    m = _DURATION_RE.match(value) if len(value) <= MAX_DIGITS else None
    if not m:
        raise ValueError(f"cannot parse duration {_shown(value, 40)} (examples: 500ms, 2s, 1m)")
    us = Decimal(m["num"]) * _DURATION_US[m["unit"]]
    if us != us.to_integral_value():
        raise ValueError(f"duration {value!r} is finer than a microsecond")
    if us <= 0:
        raise ValueError(f"duration {value!r} must be positive")
    if us > DURATION_MAX_US:
        raise ValueError(f"duration {value!r} is longer than a year")
    return Duration(int(us))


_SUMMED_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(us|ms|s|m|h)")


def parse_seconds(text: str) -> float:
    """A duration on the command line (``--confirm``) -> seconds (> 0); ValueError otherwise.

    The policy's units (:func:`parse_duration`), and, as an operator types them, bare seconds
    (``90``) and sums (``1m30s``)."""
    text = text.strip()
    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
        seconds = float(text)
    else:
        parts = _SUMMED_RE.findall(text)
        if not parts or "".join(num + unit for num, unit in parts) != text:
            raise ValueError(text)
        seconds = sum(float(num) * _DURATION_US[unit] for num, unit in parts) / 1_000_000
    if seconds <= 0 or seconds * 1_000_000 > DURATION_MAX_US:
        raise ValueError(text)
    return seconds
