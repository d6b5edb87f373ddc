"""Each model's measured cost (issue 46 item 1), kept across runs and reboots: the seconds from
a router child's start to its first answer (its **load seconds**) and the bytes its leaf held
then, under the model file's identity (state/store.py :func:`model_identity`) in the state
directory's per-model store: a model replaced by other content is a new model, a copied or moved
file keeps its cost.

Standard library only (the run time's import set: the supervisor measures and records).
"""

from __future__ import annotations

from pathlib import Path

from governor.record import record
from governor.state.store import MAX_LOAD_S, Entry, LockBusy, Store, model_identity

__all__ = ["MAX_LOAD_S", "Cost", "CostBook", "identity"]


@record(frozen=True)
class Cost:
    """One model's measured load: ``load_s`` from its child's start (or thaw) to its first
    answer, ``bytes`` its leaf's memory.current then, ``at`` when (epoch s)."""

    load_s: float
    bytes: int
    at: float


def identity(path: Path) -> str | None:
    """The model file's identity (state/store.py); None when it cannot be read."""
    return model_identity(path)


class CostBook:
    """The costs in the store of ``directory`` (None: nothing kept across runs)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    def read(self) -> dict[str, Cost]:
        """Every cost recorded; {} when there is no store or it cannot be trusted or read."""
        if self.directory is None:
            return {}
        models, _note = Store(self.directory).read()
        return {
            key: Cost(
                load_s=float(e["load"]["load_s"]), bytes=e["load"]["bytes"], at=e["load"]["at"]
            )
            for key, e in models.items()
            if "load" in e
        }

    def get(self, key: str) -> Cost | None:
        return self.read().get(key)

    def record(self, key: str, cost: Cost) -> bool:
        """Add or replace ``key``'s cost; False when nothing was written."""
        if self.directory is None:
            return False
        load = {"load_s": round(cost.load_s, 3), "bytes": cost.bytes, "at": round(cost.at, 3)}

        def change(entry: Entry) -> Entry:
            return {**entry, "load": load}

        try:
            Store(self.directory).update(key, change)
        except (OSError, LockBusy):
            return False
        return True
