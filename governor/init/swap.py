"""`governor init`'s [memory] table and its swap lines, chosen by the board's swap (issue 33:
governor/kernel/swap.py) and the draft's class, each with the reason in its comment:

- no swap: ``swap_max = "0"`` (there is nothing to swap to);
- an interactive or standard engine: ``swap_max = "0"``: its KV cache and hot weights stay in
  RAM (a token waiting on a swap-in is a stall the user sees); on zram the comment says the
  swapped pages would be board memory charged to no slice;
- a background job: a bounded ``swap_max`` (a quarter of its memory.max, at most 512 MiB) so
  it offloads cold pages instead of being killed; on zswap over an SD card (mmcblk) with
  kernel 6.8+, ``zswap_writeback = false`` keeps its pages in the compressed pool, off the card.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from governor.kernel.swap import BoardSwap, SwapReader

if TYPE_CHECKING:
    from governor.init.sizing import Sizing

MIB = 1 << 20
BACKGROUND_SWAP_CAP = 512 * MIB
ZSWAP_WRITEBACK_MIN = (6, 8)  # memory.zswap.writeback
NO_SWAP = 'swap_max = "0"  # boards run without swap; never swap the KV cache behind the budget'


def read_swap(root: Path) -> tuple[BoardSwap, bool]:
    """The board's swap under ``root`` and whether it sits on an SD card or eMMC (mmcblk: the
    device itself, or the file system of a swap file, /proc/mounts)."""
    swap = SwapReader(root / "proc", root / "sys").read()
    mounts: list[tuple[str, str]] = []
    try:
        for line in (root / "proc" / "mounts").read_text().splitlines():
            src, point, *_ = line.split()
            mounts.append((point, src))
    except (OSError, ValueError):
        pass
    mounts.sort(key=lambda m: -len(m[0]))
    sd = False
    for d in swap.devices:
        if d.type == "file":
            src = next((s for p, s in mounts if d.name.startswith(p.rstrip("/") + "/")), "")
        else:
            src = d.name
        sd = sd or "mmcblk" in src
    return swap, sd


def swap_lines(
    swap: BoardSwap, sd_card: bool, qos_class: str, mem_max: int, kernel: tuple[int, int]
) -> list[str]:
    kind = swap.kind
    if kind == "none":
        return [NO_SWAP]
    where = {
        "zram": "zram (its pool is board memory charged to no slice)",
        "zswap": "zswap (its pool is charged to this slice)",
        "disk": "a disk",
    }[kind]
    if qos_class != "background":
        return [
            f'swap_max = "0"  # this board swaps to {where}; an {qos_class} engine keeps its'
            " KV cache and weights in RAM: a swap-in is a stall the user sees"
        ]
    bound = min(BACKGROUND_SWAP_CAP, mem_max // 4) // MIB
    out = [
        f'swap_max = "{bound}MiB"  # a background job may offload cold pages to {where},'
        " bounded to a quarter of memory.max (at most 512 MiB)"
    ]
    if kind == "zswap" and sd_card:
        if kernel >= ZSWAP_WRITEBACK_MIN:
            out.append(
                "zswap_writeback = false  # the swap is on an SD card: keep this job's pages in"
                " the compressed pool, off the card"
            )
        else:
            out.append(
                "# zswap_writeback = false would keep its pages off the SD card: kernel 6.8+"
            )
    return out


def memory_table(s: Sizing, swap: list[str]) -> list[str]:
    est = s.est
    return [
        "[memory]",
        f'min = "{s.mem_min >> 20}MiB"  # the weights\' file pages ({s.mem_min >> 20} MiB) stay'
        " resident under pressure from the rest of the board",
        f'high = "{s.mem_high >> 20}MiB"  # estimate {est.total / MIB:.1f} + half the headroom'
        f" ({s.headroom / 2 / MIB:.1f}), rounded up: reclaim and throttling start here",
        f'max = "{s.mem_max >> 20}MiB"  # estimate {est.total / MIB:.1f} + headroom'
        f" {s.headroom / MIB:.1f}, rounded up; at most the {s.ceiling >> 20} MiB the board can give",
        *swap,
        "oom_group = true  # an OOM kill takes the engine's whole process tree",
        "",
    ]
