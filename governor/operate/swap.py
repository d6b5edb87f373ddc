"""The board's swap on the live board, for `governor status`, `doctor`, the metrics and the
board budget (issue 33): what the board swaps to (governor/kernel/swap.py) and what a slice's
``memory.swap.max`` costs it there. Reads; writes nothing.

On zram, a page a slice swaps out is compressed into memory no cgroup is charged for: the
slice's swap_max is board memory, at the device's current compression ratio
(mem_used_total / orig_data_size; before anything is stored the ratio is unknown and the
whole swap_max is counted). On zswap the compressed pool is charged to the slice
(memory.zswap.current); on a disk swap it costs the disk's writes, not memory.
"""

from __future__ import annotations

from typing import Any

from governor.kernel.swap import BoardSwap, SwapReader
from governor.sizes import human_bytes


def board_swap(reader: SwapReader | None = None) -> dict[str, Any]:
    """The board's swap as status and the metrics report it (BoardSwap.as_dict)."""
    return (reader or SwapReader()).read().as_dict()


def zram_ratio(swap: dict[str, Any]) -> float | None:
    """Bytes stored per byte of board memory on zram now; None before anything is stored."""
    stored, used = swap.get("zram_stored") or 0, swap.get("zram_used") or 0
    return stored / used if stored > 0 and used > 0 else None


def swap_max_cost(swap_max: int | None, swap: dict[str, Any]) -> int | None:
    """Board memory a slice's memory.swap.max can take on a zram board (None: not a zram
    board, or no swap limit in bytes); unknown ratio counts it whole."""
    if swap.get("kind") != "zram" or swap_max is None:
        return None
    ratio = zram_ratio(swap)
    return swap_max if ratio is None else int(swap_max / ratio)


def render_swap(item: dict[str, Any]) -> list[str]:
    """Status lines: the board's swap and, on zram, what this slice's swap_max costs it."""
    swap = item.get("board_swap")
    if not swap or swap["kind"] == "none":
        return []
    parts = []
    if "zram" in swap["kinds"]:
        ratio = zram_ratio(swap)
        parts.append(
            f"zram {human_bytes(swap['zram_used'])} used for {human_bytes(swap['zram_stored'])}"
            f" stored{f' ({ratio:.1f}:1)' if ratio else ''}, charged to no slice"
        )
    if "zswap" in swap["kinds"]:
        parts.append("zswap on (charged to each slice: memory.zswap.current)")
    if "disk" in swap["kinds"]:
        parts.append(f"disk {human_bytes(swap['disk_used'])} used")
    lines = ["  swap     board: " + "; ".join(parts)]
    limit = next((k for k in item.get("knobs", []) if k["file"] == "memory.swap.max"), None)
    kernel = limit["kernel"] if limit else None
    if kernel is not None and kernel != "max" and kernel.isdigit() and int(kernel) > 0:
        cost = swap_max_cost(int(kernel), swap)
        if cost is not None:
            lines.append(
                f"  swap     swap_max {human_bytes(int(kernel))} on zram costs the board up to"
                f" {human_bytes(cost)} of memory no cgroup is charged for"
            )
    return lines


__all__ = ["BoardSwap", "board_swap", "render_swap", "swap_max_cost", "zram_ratio"]
