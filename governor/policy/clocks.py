"""``[clocks]``: the clock profile that comes with a QoS profile.

Keys are the interface (issue 24): ``big`` and ``little`` (the cpufreq policies of the CPU
clusters, resolved like ``cpu.cpus = "big"``), ``npu``, ``gpu`` and ``dmc`` (devfreq devices
found on the board). Each is a governor name (``dmc = "performance"``) or a table
(``big = { governor = "userspace", min = "max" }``) of ``governor``, ``min``, ``max`` and
``freq`` (the userspace governor's fixed frequency). A frequency is ``"max"``, ``"min"``, an
integer in the unit of the board's own list (cpufreq kHz, devfreq Hz) or a value with its unit
(``"1.8GHz"``, ``"2112MHz"``); it must be in the board's available list, checked when the
policy is compiled on the board (governor/compile/clocks.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    StrictStr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from governor.policy import noplugins  # noqa: F401  # before the first model: no plugin scan

CLOCK_KEYS = ("big", "little", "npu", "gpu", "dmc")
_GOVERNOR_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")  # CPUFREQ_NAME_LEN / DEVFREQ_NAME_LEN 16-ish
_FREQ_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(Hz|kHz|MHz|GHz)\s*")
_HZ = {"Hz": 1, "kHz": 1000, "MHz": 1000_000, "GHz": 1000_000_000}


@dataclass(frozen=True)
class Freq:
    """``max``/``min`` of the board's list, a number in the list's unit, or Hz."""

    kind: Literal["max", "min", "raw", "hz"]
    value: int = 0

    def __str__(self) -> str:
        if self.kind in ("max", "min"):
            return self.kind
        return str(self.value) if self.kind == "raw" else f"{self.value}Hz"


def parse_freq(value: object) -> Freq:
    if isinstance(value, Freq):
        return value
    if value in ("max", "min"):
        return Freq(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return Freq("raw", value)
    if isinstance(value, str) and (m := _FREQ_RE.fullmatch(value)):
        hz = Decimal(m[1]) * _HZ[m[2]]
        if hz <= 0 or hz != int(hz):
            raise ValueError(f"frequency {value!r} is not a whole number of Hz")
        return Freq("hz", int(hz))
    raise ValueError(
        f'expected "max", "min", a number from the board\'s available list or a value with'
        f' its unit ("1.8GHz", "2112MHz"), got {value!r}'[:200]
    )


_FREQ_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 1, "description": "in the unit of the board's list"},
        {
            "type": "string",
            "pattern": r"^(max|min|\s*[0-9]+(\.[0-9]+)?\s*(Hz|kHz|MHz|GHz)\s*)$",
            "description": "'max', 'min' or a value with its unit ('1.8GHz')",
        },
    ]
}
FreqValue = Annotated[
    Freq,
    BeforeValidator(parse_freq),
    WithJsonSchema(_FREQ_SCHEMA),
    PlainSerializer(lambda f: f.value if f.kind == "raw" else str(f), return_type=Any),
]


class ClockSetting(BaseModel):
    """One clock: its governor and/or its bounds."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    governor: StrictStr | None = None
    min: FreqValue | None = None
    max: FreqValue | None = None
    freq: FreqValue | None = None

    @field_validator("governor")
    @classmethod
    def _governor(cls, name: str | None) -> str | None:
        if name is not None and not _GOVERNOR_RE.fullmatch(name):
            raise ValueError(f"invalid governor name {name[:40]!r}")
        return name

    @model_validator(mode="after")
    def _consistent(self) -> ClockSetting:
        if self.governor is None and self.min is None and self.max is None and self.freq is None:
            raise ValueError("an empty clock table: give governor, min, max or freq")
        if self.freq is not None and self.governor != "userspace":
            raise ValueError('freq needs governor = "userspace" (only it takes a fixed frequency)')
        return self


def _setting(value: object) -> object:
    """``dmc = "performance"`` is ``dmc = { governor = "performance" }``."""
    return {"governor": value} if isinstance(value, str) else value


Clock = Annotated[
    ClockSetting,
    BeforeValidator(_setting),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "description": "a governor name, e.g. 'performance'"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "governor": {"type": "string"},
                        "min": _FREQ_SCHEMA,
                        "max": _FREQ_SCHEMA,
                        "freq": _FREQ_SCHEMA,
                    },
                },
            ]
        }
    ),
]


class ClocksSection(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    big: Clock | None = None
    little: Clock | None = None
    npu: Clock | None = None
    gpu: Clock | None = None
    dmc: Clock | None = None

    def items(self) -> list[tuple[str, ClockSetting]]:
        return [(k, s) for k in CLOCK_KEYS if (s := getattr(self, k)) is not None]
