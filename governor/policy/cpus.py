"""CPU lists in the policy language: "big", "little", "all" or an explicit list ("0-3,6")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from governor.kernel.parse import format_cpulist

_CPULIST_RE = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")
# CONFIG_NR_CPUS tops out at 8192 on arm64/x86_64 distribution kernels
MAX_CPU = 8191


@dataclass(frozen=True)
class CpuSpec:
    """ "big", "little", "all" or an explicit list of CPU numbers."""

    kind: Literal["list", "big", "little", "all"]
    cpus: tuple[int, ...] = ()

    def __str__(self) -> str:
        if self.kind != "list":
            return self.kind

        return format_cpulist(self.cpus)


def parse_cpus(value: object) -> CpuSpec:
    if isinstance(value, CpuSpec):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a CPU list like '4-7' or 'big'/'little'/'all', got {value!r}")
    text = value.strip()
    if text in ("big", "little", "all"):
        return CpuSpec(text)  # type: ignore[arg-type]  # narrowed by `in`
    if not _CPULIST_RE.fullmatch(text):
        raise ValueError(f"cannot parse CPU list {value!r} (examples: '0-3,6', 'big', 'all')")
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise ValueError(f"descending CPU range {part!r} in {value!r}")
        if b > MAX_CPU:
            raise ValueError(f"CPU {b} in {value!r} is beyond any kernel's limit ({MAX_CPU})")
        cpus.update(range(a, b + 1))
    return CpuSpec("list", tuple(sorted(cpus)))
