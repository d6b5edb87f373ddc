"""A cgroup's flat-keyed file (memory.stat, memory.events) as the benchmarks read it: tolerant
(a missing file or a line that is not "key integer" is skipped), unlike the governor's own
strict reader (governor/kernel/parse.py parse_flat_keyed), since a benchmark reads a group that
may be gone."""

from __future__ import annotations

import contextlib
from pathlib import Path


def read_kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[k] = int(v)
    return out
