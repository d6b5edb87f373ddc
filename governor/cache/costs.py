"""Each model's measured cost (issue 46 item 1), kept across runs: the seconds from a router
child's start to its first answer (its **load seconds**) and the bytes its leaf held then,
per model identity, in one small file of the cache directory (cache/store.py's trust rules:
a directory and an entry the effective user or root owns, written atomically 0600).

The identity is the model file's (:func:`identity`: its name, size and mtime, as the plan
cache keys a model): a model replaced by another file of the same name is a new model, and a
path that moved keeps its cost. The file is bounded (MAX_MODELS entries, the most recently
measured kept; FILE_CAP bytes, a bigger one is not read) and validated entry by entry: an
entry that is not what :func:`render` writes is dropped, never trusted.

Standard library only (the run time's import set: the supervisor measures and records).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from governor.cache.store import trusted_dir, write_entry
from governor.peer.files import read_capped
from governor.record import record

FILE = "model-costs.json"
FORMAT = 1
MAX_MODELS = 128  # entries kept, the most recently measured
FILE_CAP = 64 * 1024  # a file bigger than this is not read (128 entries take ~20 KiB)
MAX_KEY = 512  # characters of an identity
MAX_LOAD_S = 24 * 3600.0  # a load that "took" longer is no measurement


@record(frozen=True)
class Cost:
    """One model's measured load: ``load_s`` from its child's start (or thaw) to its first
    answer, ``bytes`` its leaf's memory.current then, ``at`` when (epoch s)."""

    load_s: float
    bytes: int
    at: float


def identity(path: Path) -> str | None:
    """``NAME|SIZE|MTIME_NS`` of a model file; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{path.name}|{st.st_size}|{st.st_mtime_ns}"[:MAX_KEY]


def _number(x: Any) -> float | None:
    ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def _cost(v: Any) -> Cost | None:
    if not isinstance(v, dict):
        return None
    load_s, at, size = _number(v.get("load_s")), _number(v.get("at")), v.get("bytes")
    if load_s is None or at is None or not (0 <= load_s <= MAX_LOAD_S):
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return None
    return Cost(load_s=load_s, bytes=size, at=at)


def parse(raw: bytes) -> dict[str, Cost]:
    """The costs a file holds (pure): every valid entry; {} for a file that is no such file."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    models = data.get("models")
    if not isinstance(models, dict):
        return {}
    out: dict[str, Cost] = {}
    for key, value in models.items():
        cost = _cost(value)
        if isinstance(key, str) and len(key) <= MAX_KEY and cost is not None:
            out[key] = cost
    return _newest(out)


def _newest(costs: dict[str, Cost]) -> dict[str, Cost]:
    keep = sorted(costs.items(), key=lambda kv: (-kv[1].at, kv[0]))[:MAX_MODELS]
    return dict(sorted(keep))


def render(costs: dict[str, Cost]) -> bytes:
    """The file (pure): at most MAX_MODELS entries, the most recently measured."""
    models = {
        k: {"load_s": round(c.load_s, 3), "bytes": c.bytes, "at": round(c.at, 3)}
        for k, c in _newest(costs).items()
    }
    return json.dumps({"format": FORMAT, "models": models}, sort_keys=True).encode() + b"\n"


class CostBook:
    """The cost file in ``directory`` (None: nothing kept across runs, costs live in memory)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    def read(self) -> dict[str, Cost]:
        """Every cost recorded; {} when there is no file or it cannot be trusted or read."""
        if self.directory is None or not trusted_dir(self.directory):
            return {}
        try:
            raw = read_capped(self.directory / FILE, FILE_CAP, follow=False)
        except OSError:
            return {}
        return parse(raw)

    def get(self, key: str) -> Cost | None:
        return self.read().get(key)

    def record(self, key: str, cost: Cost) -> bool:
        """Add or replace ``key``'s cost; False when nothing was written."""
        if self.directory is None:
            return False
        costs = self.read()
        costs[key[:MAX_KEY]] = cost
        return write_entry(self.directory, FILE, render(costs))
