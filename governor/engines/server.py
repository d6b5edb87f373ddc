"""llama-server's own memory, beside what every llama.cpp engine has (governor/engines/estimate.py).

llama-server adds (tools/server, same version):
- slots: ``-np`` (absent or -1 = auto: 4 slots sharing one unified KV buffer of -c cells);
  without ``--kv-unified`` each slot gets -c / np cells padded to 256 (llama-context.cpp), so
  the KV term is the padded sum.
- prompt_cache: idle slots' states (their prompt's KV) saved in RAM up to ``--cache-ram`` MiB
  (default 8192; -1 = no size limit; 0 = off). The cache evicts whole states, oldest first, to
  stay within its limit (server_prompt_cache::alloc), so the limit bounds it: counted whole.
- checkpoints: up to ``--ctx-checkpoints`` (default 32) per slot, made only for models that
  cannot roll their memory back (sliding-window attention, recurrent state); each holds the SWA
  part of the slot's KV (n_swa + ubatch cells, an upper bound: every layer counted as SWA).
  A recurrent model's checkpoints are not sized (a warning says so).
- margin: the HTTP threads and the server's own buffers (measured, docs/calibration.md).

The Settings (governor/engines/settings.py) carry the resolved numbers (slots, kv_unified, cache_ram_mib,
ctx_checkpoints); this module turns them into terms.
"""

from __future__ import annotations

import math

from governor.engines.gguf import GgufInfo
from governor.engines.settings import KV_CELL_PAD, Settings

MIB = 1 << 20
# the HTTP thread pool, task queues and a request's heap on top of the engine's margin: its anon
# beyond KV and compute is 3-4 MiB above llama-completion's typical run in the kernel guest
# (perf/accuracy.py, docs/calibration.md; the binary is the engine term), of which the engine's
# margin already holds 1.5 MiB (its worst run): 15 MiB in all for a server, as measured
MARGIN_BYTES = 5 * MIB // 2
# llama-server's defaults (what an absent -np, --cache-ram, --ctx-checkpoints mean):
# governor/engines/llama.py, SERVER_*


def checkpoint_bytes(info: GgufInfo, s: Settings, token_bytes: float) -> int:
    """One context checkpoint of a slot: the SWA part of its KV, n_swa + ubatch cells padded to
    256 (llama-kv-cache-iswa.cpp), at most the slot's context; every layer counted as SWA (an
    upper bound). 0 for a model the server never checkpoints (no sliding window)."""
    if not info.sliding_window:
        return 0
    cells = math.ceil((info.sliding_window + s.ubatch) / KV_CELL_PAD) * KV_CELL_PAD
    return int(min(cells, s.slot_cells) * token_bytes)


def terms(info: GgufInfo, s: Settings, token_bytes: float) -> list[tuple[str, int, str]]:
    """(name, bytes, detail) of the prompt cache and the checkpoints; ``token_bytes`` is the KV
    of one token over all layers."""
    if s.cache_ram_mib < 0:
        cache = ("prompt_cache", 0, "NO LIMIT (--cache-ram -1): grows with every new conversation")
    elif s.cache_ram_mib == 0:
        cache = ("prompt_cache", 0, "off (--cache-ram 0)")
    else:
        per_state = s.slot_cells * token_bytes
        cache = (
            "prompt_cache",
            s.cache_ram_mib * MIB,
            f"--cache-ram {s.cache_ram_mib} MiB of saved prompt states"
            f" (a full slot's state {per_state / MIB:.0f} MiB)",
        )
    ckpt = checkpoint_bytes(info, s, token_bytes)
    if not ckpt or not s.ctx_checkpoints:
        why = (
            "--ctx-checkpoints 0"
            if not s.ctx_checkpoints
            else "not sized: recurrent state"
            if info.recurrent
            else "none: the model has no sliding window"
        )
        return [cache, ("checkpoints", 0, why)]
    return [
        cache,
        (
            "checkpoints",
            s.slots * s.ctx_checkpoints * ckpt,
            f"{s.slots} slots x {s.ctx_checkpoints} x {ckpt / MIB:.1f} MiB"
            f" (SWA {info.sliding_window} + ubatch cells)",
        ),
    ]
