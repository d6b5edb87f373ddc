"""The numbers behind a drafted policy's memory values (governor/init/draft.py), apart so
that the draft's helpers (draft_board, draft_qos, draft_swap) read the type without a circle."""

from __future__ import annotations

from dataclasses import dataclass

from governor.engines.estimate import Estimate


@dataclass(frozen=True)
class Sizing:
    """Every number behind the policy's memory values."""

    board: int
    board_source: str
    reserve: int
    ceiling: int
    largest_ctx: int
    ctx: int
    est: Estimate
    headroom: int
    mem_min: int
    mem_high: int
    mem_max: int
    claimed: int = 0  # the other slices' peak claims (the board's tenants)
    tenants: tuple[str, ...] = ()  # "batch 950 MiB (running)", largest first
