"""Where scripts/engine-setup leaves llama.cpp and the synthetic models (the engine cache).

GOVERNOR_ENGINE_CACHE overrides the default /var/lib/governor/engine (the harness passes GOVERNOR_*
variables into the guests, and the guests see the host's /var through an overlay)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE = Path(os.environ.get("GOVERNOR_ENGINE_CACHE", "/var/lib/governor/engine"))
BIN = CACHE / "bin"
COMPLETION = BIN / "llama-completion"
SIMPLE = BIN / "llama-simple"
TINY = CACHE / "models" / "tiny.gguf"
BIG = CACHE / "models" / "qwen18b.gguf"
# qwen18b's shape at 1/8 of its size (12 x 1024, vocab 32000, q4_0 + q8_0 output, 134 MiB): the
# same memory physics (file pages + CPU_REPACK copy + KV above memory.max) ~10x faster in a guest
SMALL = CACHE / "models" / "small.gguf"
# a LLaVA-style vision projector for TINY (tests/engine/make_mmproj.py): 256 tokens an image
MMPROJ = CACHE / "models" / "mmproj-tiny.gguf"
MTMD_CLI = BIN / "llama-mtmd-cli"
