"""The engine options that change llama.cpp's memory, resolved to numbers (pure): what the
estimate (governor/engines/estimate.py) and llama-server's own terms (governor/engines/server.py)
both read, so that neither imports the other for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from governor.engines.llama import EngineArgs
from governor.engines.projector import Projector

KV_CELL_PAD = 256  # llama.cpp pads the KV cache size to a multiple of 256 cells
DEFAULT_BATCH = 2048  # llama.cpp common_params defaults: -b 2048, -ub 512
DEFAULT_UBATCH = 512


@dataclass(frozen=True)
class Settings:
    """The engine options that change memory, resolved to numbers."""

    ctx: int
    batch: int = DEFAULT_BATCH
    ubatch: int = DEFAULT_UBATCH
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    repack: bool = True
    load_mode: str = "mmap"
    # llama-server (server False: a one-shot engine, none of these apply)
    server: bool = False
    slots: int = 1
    kv_unified: bool = True
    cache_ram_mib: int = 0  # -1: no limit
    ctx_checkpoints: int = 0
    # --mmproj: the vision projector read from its file (governor/engines/projector.py)
    projector: Projector | None = None
    # the engine's binary and the libraries beside it, bytes (governor/engines/engine_files.py;
    # None: the program is not a file found on disk, estimate.ENGINE_FILE_BYTES)
    engine_files: int | None = None

    @property
    def mmap(self) -> bool:
        return self.load_mode in ("mmap", "mmap+mlock", "auto")

    @property
    def kv_cells(self) -> int:
        """KV cells llama.cpp allocates: -c padded to 256; without a unified KV buffer each of
        the slots gets -c / slots padded to 256 (llama-context.cpp)."""
        cells = math.ceil(self.ctx / KV_CELL_PAD) * KV_CELL_PAD
        if self.server and not self.kv_unified and self.slots > 1:
            per_slot = math.ceil(cells // self.slots / KV_CELL_PAD) * KV_CELL_PAD
            return max(per_slot, KV_CELL_PAD) * self.slots
        return cells

    @property
    def slot_cells(self) -> int:
        """The context one slot can hold."""
        if self.server and not self.kv_unified and self.slots > 1:
            return self.kv_cells // self.slots
        return self.kv_cells


def settings_from_argv(args: EngineArgs, n_ctx_train: int) -> Settings:
    """-c absent or 0 means n_ctx_train (tools/common/arg.cpp); --no-mmap = -lm none."""
    load_mode = args.load_mode or ("none" if "no_mmap" in args.flags else "mmap")
    base = Settings(
        ctx=args.ctx or n_ctx_train,
        batch=args.batch or DEFAULT_BATCH,
        ubatch=args.ubatch or DEFAULT_UBATCH,
        cache_type_k=(args.cache_type_k or "f16").lower(),
        cache_type_v=(args.cache_type_v or "f16").lower(),
        repack=args.repacks,
        load_mode=load_mode,
    )
    if not args.server:
        return base
    return replace(
        base,
        server=True,
        slots=args.server_slots,
        # auto slots force a unified KV buffer; an explicit -np defaults to one per slot
        kv_unified=True if args.server_auto_slots else bool(args.kv_unified),
        cache_ram_mib=args.server_cache_ram_mib,
        ctx_checkpoints=args.server_ctx_checkpoints,
    )
