"""`governor init`'s swap lines (issue 33): chosen by the board's swap and the draft's class,
each with its reason; the SD card found under a swap file. Needs: a tmp /proc + /sys tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.init.swap import NO_SWAP, read_swap, swap_lines
from governor.kernel.swap import BoardSwap, SwapDevice
from governor.policy.loader import load_text

MIB = 1 << 20
ZRAM = BoardSwap(devices=(SwapDevice("/dev/zram0", "partition", 1 << 30, 0, 100),))
ZSWAP = BoardSwap(devices=(SwapDevice("/swapfile", "file", 1 << 30, 0, -2),), zswap_enabled=True)


def _parses(lines: list[str]) -> dict[str, object]:
    return load_text('name = "x"\n[memory]\n' + "\n".join(lines) + "\n").memory.model_dump()


def test_no_swap_keeps_the_old_line() -> None:
    assert swap_lines(BoardSwap(), False, "background", 1 << 30, (6, 8)) == [NO_SWAP]


@pytest.mark.parametrize("cls", ["interactive", "standard"])
def test_an_interactive_engine_never_swaps_and_says_what_the_board_swaps_to(cls: str) -> None:
    (line,) = swap_lines(ZRAM, False, cls, 1 << 30, (6, 8))
    assert line.startswith('swap_max = "0"') and "zram" in line and "charged to no slice" in line
    assert _parses([line])["swap_max"] is not None


def test_a_background_job_gets_a_bounded_swap_max() -> None:
    (line,) = swap_lines(ZRAM, False, "background", 1 << 30, (6, 8))
    assert line.startswith('swap_max = "256MiB"')  # a quarter of memory.max
    (line,) = swap_lines(ZRAM, False, "background", 4 << 30, (6, 8))
    assert line.startswith('swap_max = "512MiB"')  # at most 512 MiB


def test_on_zswap_over_an_sd_card_writeback_is_off_where_the_kernel_has_it() -> None:
    lines = swap_lines(ZSWAP, True, "background", 1 << 30, (6, 8))
    assert lines[1].startswith("zswap_writeback = false")
    assert _parses(lines)["zswap_writeback"] is False
    old = swap_lines(ZSWAP, True, "background", 1 << 30, (6, 1))
    assert old[1].startswith("# zswap_writeback") and "6.8" in old[1]
    assert len(swap_lines(ZSWAP, False, "background", 1 << 30, (6, 8))) == 1  # not an SD card


def test_a_swap_file_on_an_mmcblk_file_system_is_an_sd_card(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "swaps").write_text(
        "Filename Type Size Used Priority\n/var/swap file 102396 0 -2\n"
    )
    (tmp_path / "proc" / "mounts").write_text(
        "/dev/mmcblk0p2 / ext4 rw 0 0\n/dev/sda1 /data ext4 rw 0 0\n"
    )
    swap, sd = read_swap(tmp_path)
    assert swap.kind == "disk" and sd is True
    (tmp_path / "proc" / "swaps").write_text(
        "Filename Type Size Used Priority\n/data/swap file 102396 0 -2\n"
    )
    assert read_swap(tmp_path)[1] is False
