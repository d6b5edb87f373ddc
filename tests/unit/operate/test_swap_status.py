"""`governor status`'s swap lines (issue 33): the board's zram pool as memory charged to no
slice, and what the slice's swap_max costs the board at the device's compression ratio.
Needs: nothing."""

from __future__ import annotations

from typing import Any

from governor.kernel.swap import BoardSwap, SwapDevice, ZramStat
from governor.operate.swap import render_swap, swap_max_cost, zram_ratio

MIB = 1 << 20


def _zram(stored: int, used: int) -> dict[str, Any]:
    return BoardSwap(
        devices=(SwapDevice("/dev/zram0", "partition", 1 << 30, stored, 100),),
        zram=(ZramStat("zram0", stored, used - MIB, used),) if stored else (),
    ).as_dict()


def test_swap_max_on_zram_costs_the_board_at_the_current_ratio() -> None:
    swap = _zram(400 * MIB, 100 * MIB)
    assert zram_ratio(swap) == 4.0
    assert swap_max_cost(256 * MIB, swap) == 64 * MIB
    assert swap_max_cost(256 * MIB, _zram(0, 0)) == 256 * MIB  # nothing stored: counted whole
    assert swap_max_cost(None, swap) is None
    disk = BoardSwap(devices=(SwapDevice("/swapfile", "file", 1 << 30, 0, -2),)).as_dict()
    assert swap_max_cost(256 * MIB, disk) is None


def test_status_lines_name_the_pool_and_the_cost() -> None:
    item = {
        "board_swap": _zram(400 * MIB, 100 * MIB),
        "knobs": [{"file": "memory.swap.max", "kernel": str(128 * MIB)}],
    }
    lines = render_swap(item)
    assert lines[0] == (
        "  swap     board: zram 100MiB used for 400MiB stored (4.0:1), charged to no slice"
    )
    assert lines[1].endswith("swap_max 128MiB on zram costs the board up to 32MiB of memory no"
                             " cgroup is charged for")  # fmt: skip
    item["knobs"] = [{"file": "memory.swap.max", "kernel": "0"}]
    assert len(render_swap(item)) == 1
    assert render_swap({"board_swap": BoardSwap().as_dict()}) == []
