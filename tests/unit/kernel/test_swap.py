"""The board's swap (governor/kernel/swap.py): /proc/swaps, zram's mm_stat and zswap's switch,
parsed from text as the kernel prints it, and read from a tmp /proc + /sys tree.

Needs: nothing (text pasted from real machines: the header and zero row of this repo's
development host, 6.18; a zram swap line as util-linux's zramctl sets it up)."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.kernel.swap import (
    SwapReader,
    parse_mm_stat,
    parse_swaps,
    parse_zswap_enabled,
    usable_zram,
    zram_room,
)

SWAPS_ZRAM_AND_FILE = (
    "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
    "/dev/zram0                              partition\t1048572\t\t524288\t\t100\n"
    "/swap\\040file                           file\t\t262140\t\t1024\t\t-2\n"
)
# 6.x: nine columns (huge_pages_since since 6.0); 5.10 prints eight
MM_STAT_6 = "536870912 134217728 142606336        0 142606336     1024        0        0        0\n"
MM_STAT_5_10 = "  4096000   1024000   1200128        0  1200128       12        0        0\n"


def test_proc_swaps_lines_are_bytes_and_zram_is_named() -> None:
    devices = parse_swaps(SWAPS_ZRAM_AND_FILE)
    assert [d.name for d in devices] == ["/dev/zram0", "/swap\\040file"]
    zram, disk = devices
    assert (zram.type, zram.size, zram.used, zram.priority) == (
        "partition", 1048572 * 1024, 524288 * 1024, 100,
    )  # fmt: skip
    assert zram.zram == "zram0" and disk.zram is None
    assert disk.used == 1024 * 1024 and disk.priority == -2


def test_an_empty_proc_swaps_is_no_device() -> None:
    assert parse_swaps("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n") == ()


def test_a_swaps_line_with_a_missing_column_is_refused() -> None:
    with pytest.raises(ValueError, match="unexpected line"):
        parse_swaps("Filename Type Size Used Priority\n/dev/zram0 partition 1024 0\n")


@pytest.mark.parametrize("text", [MM_STAT_6, MM_STAT_5_10])
def test_mm_stat_gives_stored_compressed_and_pool_bytes(text: str) -> None:
    st = parse_mm_stat(text, "zram1")
    first = [int(t) for t in text.split()[:3]]
    assert st.device == "zram1"
    assert [st.orig_data_size, st.compr_data_size, st.mem_used_total] == first


def test_mm_stat_with_fewer_than_three_numbers_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        parse_mm_stat("4096 1024\n")


@pytest.mark.parametrize(("text", "on"), [("Y\n", True), ("N\n", False)])
def test_zswap_enabled_is_the_module_parameter(text: str, on: bool) -> None:
    assert parse_zswap_enabled(text) is on


def _tree(tmp_path: Path, swaps: str, mm: dict[str, str], zswap: str | None) -> SwapReader:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    (proc / "swaps").write_text(swaps)
    for dev, text in mm.items():
        (sys / "block" / dev).mkdir(parents=True)
        (sys / "block" / dev / "mm_stat").write_text(text)
    if zswap is not None:
        (sys / "module/zswap/parameters").mkdir(parents=True)
        (sys / "module/zswap/parameters/enabled").write_text(zswap)
    return SwapReader(proc, sys)


def test_a_zram_board_counts_the_pool_as_used_memory(tmp_path: Path) -> None:
    board = _tree(tmp_path, SWAPS_ZRAM_AND_FILE, {"zram0": MM_STAT_6}, "N\n").read()
    assert board.kind == "zram"
    assert board.kinds == ("zram", "disk")
    assert board.zram_used == 142606336  # mem_used_total, not the compressed size
    assert board.zram_stored == 536870912
    assert board.disk_used == 1024 * 1024
    assert board.zram[0].compr_data_size == 134217728
    assert board.as_dict()["zram_used"] == 142606336


def test_zswap_in_front_of_a_disk_swap(tmp_path: Path) -> None:
    swaps = "Filename Type Size Used Priority\n/swapfile file 1048572 0 -2\n"
    board = _tree(tmp_path, swaps, {}, "Y\n").read()
    assert board.kinds == ("zswap", "disk") and board.kind == "zswap"
    assert board.zram_used == 0


def test_zswap_enabled_without_a_swap_device_is_no_swap(tmp_path: Path) -> None:
    board = _tree(tmp_path, "Filename Type Size Used Priority\n", {}, "Y\n").read()
    assert board.kind == "none" and board.kinds == ()


def test_a_missing_mm_stat_is_reported_not_raised(tmp_path: Path) -> None:
    reader = _tree(tmp_path, SWAPS_ZRAM_AND_FILE, {}, None)
    board = reader.read()
    assert board.zram == () and board.zswap_enabled is None
    assert len(board.zram_errors) == 1 and "zram0/mm_stat" in board.zram_errors[0]
    assert board.swaps_error is None and board.size == (1048572 + 262140) * 1024


def test_no_proc_swaps_is_an_unknown_swap_not_none(tmp_path: Path) -> None:
    board = SwapReader(tmp_path / "none", tmp_path / "none").read()
    assert board.devices == () and board.size is None
    assert board.swaps_error is not None and "none/swaps" in board.swaps_error


def test_an_unparsable_proc_swaps_is_an_unknown_swap(tmp_path: Path) -> None:
    board = _tree(tmp_path, "Filename Type Size Used Priority\n/dev/x partition\n", {}, None).read()
    assert board.size is None and board.swaps_error is not None
    assert "unexpected line" in board.swaps_error


# ---------------------------------------------------------------- usable zram (issue 47)

MIB = 1 << 20


def test_usable_zram_is_swapfree_or_what_available_memory_can_hold_compressed() -> None:
    """lmkd's get_free_swap: min(SwapFree, available x ratio)."""
    # plenty of memory: the device's free space is the limit
    assert usable_zram(512 * MIB, 1024 * MIB, 3.0) == 512 * MIB
    # little memory: 100 MiB holds 300 MiB of pages at 3:1, however empty the device
    assert usable_zram(2048 * MIB, 100 * MIB, 3.0) == 300 * MIB
    assert usable_zram(2048 * MIB, -5, 3.0) == 0


def test_zram_room_is_what_the_compression_gives_back() -> None:
    # 300 MiB of pages swapped at 3:1 leave memory and take 100 MiB back: 200 MiB freed
    assert zram_room(2048 * MIB, 100 * MIB, 3.0) == 200 * MIB
    assert zram_room(512 * MIB, 1024 * MIB, 2.0) == 256 * MIB
    # no ratio measured yet, or no gain: nothing counted
    assert zram_room(2048 * MIB, 1024 * MIB, None) == 0
    assert zram_room(2048 * MIB, 1024 * MIB, 1.0) == 0


def test_board_swap_counts_zram_free_space_and_its_measured_ratio(tmp_path: Path) -> None:
    reader = _tree(tmp_path, SWAPS_ZRAM_AND_FILE, {"zram0": MM_STAT_6}, "N\n")
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 2097152 kB\nMemAvailable: 102400 kB\n")
    board = reader.read()
    # zram0: 1048572 KiB, 524288 KiB used; the file's free space is not zram's
    assert board.zram_free == (1048572 - 524288) * 1024
    # mm_stat: 512 MiB stored in a 136 MiB pool
    assert board.zram_ratio == pytest.approx(536870912 / 142606336)
    assert reader.available() == 100 * MIB
    ratio = 536870912 / 142606336
    assert board.zram_room(reader.available()) == int(100 * MIB * ratio * (1 - 1 / ratio))


def test_zram_ratio_is_unknown_before_anything_is_stored_or_when_mm_stat_failed(
    tmp_path: Path,
) -> None:
    empty = "0 0 0 0 0 0 0 0 0\n"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert (
        _tree(tmp_path / "a", SWAPS_ZRAM_AND_FILE, {"zram0": empty}, None).read().zram_ratio is None
    )
    failed = _tree(tmp_path / "b", SWAPS_ZRAM_AND_FILE, {}, None)
    assert failed.read().zram_ratio is None
    assert failed.available() == 0  # no /proc/meminfo: nothing counted
