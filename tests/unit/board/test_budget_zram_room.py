"""Usable zram on the board's budget (issue 47): admission's peaks may overlap by the memory
that swapping usable zram (lmkd's min(SwapFree, available x ratio)) gives back; the guarantees
never count it. Needs: a tmp tree (a fake /proc and /sys)."""

from __future__ import annotations

from pathlib import Path

from governor.board.budget import Budget, admit
from governor.board.scan import scan
from governor.board.slice import QosClass, Slice
from governor.operate.boardview import render, view
from governor.record import replace

MIB = 1 << 20


def _claim(name: str, cls: str, mn: int, peak: int) -> Slice:
    return Slice(
        name=name, cgroup=f"g/{name}", qos=QosClass(cls), min=mn, peak=peak, peak_source="max"
    )


def test_zram_room_lets_the_peaks_overlap_but_never_a_guarantee() -> None:
    budget = Budget.of(2048 * MIB, 512 * MIB)  # 1.5 GiB for the slices
    bg = _claim("bg", "background", 256 * MIB, 512 * MIB)
    chat = _claim("chat", "interactive", 1100 * MIB, 1200 * MIB)
    assert admit(budget, chat, (bg,)).kind == "peaks"  # 176 MiB over at peak
    assert admit(budget, chat, (bg,)).missing == 176 * MIB
    roomy = replace(budget, zram_room=200 * MIB)
    assert admit(roomy, chat, (bg,)).kind == "fits"
    short = admit(replace(budget, zram_room=100 * MIB), chat, (bg,))
    assert (short.kind, short.missing) == ("peaks", 76 * MIB)
    # memory.min is memory: zram's room changes no guarantee
    big = _claim("big", "interactive", 1400 * MIB, 1400 * MIB)
    assert admit(replace(budget, zram_room=1024 * MIB), big, (bg,)).kind == "guarantees"


def _board(tmp_path: Path, mm_stat: str) -> Path:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 2097152 kB\nMemAvailable: 204800 kB\n")
    (tmp_path / "proc" / "swaps").write_text(
        "Filename Type Size Used Priority\n/dev/zram0 partition 1048576 262144 100\n"
    )
    (tmp_path / "sys/block/zram0").mkdir(parents=True)
    (tmp_path / "sys/block/zram0/mm_stat").write_text(mm_stat)
    return tmp_path


def test_the_scan_counts_usable_zram_at_its_measured_ratio(tmp_path: Path) -> None:
    # 256 MiB stored in a 64 MiB pool: 4:1; 768 MiB of the device free; 200 MiB available
    # holds 800 MiB compressed, so 768 MiB are usable and give back 768 x 3/4 = 576 MiB
    root = _board(tmp_path, f"{256 * MIB} {60 * MIB} {64 * MIB} 0 0\n")
    got = scan(run=root / "run", cgroup_root=root / "cg", root=root, board=root / "none.toml")
    assert got.budget.zram_room == 576 * MIB
    text = render(view(got.budget, got.slices, problems=got.notes))
    assert "zram: peaks may overlap by 576 MiB more (usable zram)" in text.splitlines()


def test_the_scan_counts_no_zram_room_before_zram_stored_anything(tmp_path: Path) -> None:
    root = _board(tmp_path, "0 0 0 0 0\n")
    got = scan(run=root / "run", cgroup_root=root / "cg", root=root, board=root / "none.toml")
    assert got.budget.zram_room == 0
    assert "zram:" not in render(view(got.budget, got.slices))
