"""Where scripts/engine-setup leaves llama.cpp and the synthetic models (the engine cache):
perf/_helpers/engine_paths.py, which perf/ also reads (perf/ does not import from tests/)."""

from __future__ import annotations

from perf._helpers.engine_paths import BIG, BIN, CACHE, COMPLETION, SIMPLE, SMALL, TINY

__all__ = ["BIG", "BIN", "CACHE", "COMPLETION", "SIMPLE", "SMALL", "TINY"]
