"""zram's pool on the board's budget (issue 33): memory no cgroup is charged for counts as a
claim in `governor board` and in admission. Needs: a tmp tree (a fake /proc and /sys)."""

from __future__ import annotations

from pathlib import Path

from governor.board.budget import ZRAM_CLAIM, Budget, admit, zram_claim
from governor.board.scan import scan as gather
from governor.board.slice import QosClass, Slice
from governor.operate.boardview import render, view

MIB = 1 << 20


def _claim(name: str, cls: str, mn: int, peak: int) -> Slice:
    return Slice(
        name=name, cgroup=f"g/{name}", qos=QosClass(cls), min=mn, peak=peak, peak_source="max"
    )


def test_zram_holds_board_memory_that_refuses_a_guarantee_and_is_never_a_victim() -> None:
    budget = Budget.of(2048 * MIB, 512 * MIB)  # 1.5 GiB for the slices
    bg = _claim("bg", "background", 256 * MIB, 512 * MIB)
    chat = _claim("chat", "interactive", 1100 * MIB, 1200 * MIB)
    assert admit(budget, chat, (bg,)).fits is False  # peaks overcommit, guarantees fit
    assert admit(budget, chat, (bg,)).kind == "peaks"
    zram = zram_claim(300 * MIB)
    assert zram is not None and zram.guaranteed == zram.peak_claim == 300 * MIB
    verdict = admit(budget, chat, (bg, zram))
    assert verdict.kind == "guarantees"  # 256 + 300 + 1100 MiB > 1536 MiB
    assert verdict.missing == 120 * MIB
    assert [h.name for h in verdict.holders] == [ZRAM_CLAIM, "bg"]
    assert ZRAM_CLAIM not in [v.name for v in verdict.victims]  # only the background slice
    assert zram_claim(0) is None


def test_gather_counts_zram_mem_used_total(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 2097152 kB\n")
    (tmp_path / "proc" / "swaps").write_text(
        "Filename Type Size Used Priority\n/dev/zram0 partition 1048572 262144 100\n"
    )
    (tmp_path / "sys/block/zram0").mkdir(parents=True)
    (tmp_path / "sys/block/zram0/mm_stat").write_text(f"{256 * MIB} {70 * MIB} {72 * MIB} 0 0\n")
    got = gather(run=tmp_path / "run", cgroup_root=tmp_path / "cg", root=tmp_path,
                 board=tmp_path / "none.toml")  # fmt: skip
    (zram,) = [c for c in got.slices if c.name == ZRAM_CLAIM]
    assert zram.guaranteed == 72 * MIB and zram.current == 72 * MIB
    (tmp_path / "proc" / "swaps").write_text("Filename Type Size Used Priority\n")
    got = gather(run=tmp_path / "run", cgroup_root=tmp_path / "cg", root=tmp_path,
                 board=tmp_path / "none.toml")  # fmt: skip
    assert ZRAM_CLAIM not in [c.name for c in got.slices]


def test_an_unreadable_zram_mm_stat_is_a_skipped_line_of_the_board(tmp_path: Path) -> None:
    """Its pool cannot be counted: `governor board` says so, as for any other skipped input
    (issue 43, low), instead of dropping the claim without a word."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 2097152 kB\n")
    (tmp_path / "proc" / "swaps").write_text(
        "Filename Type Size Used Priority\n/dev/zram0 partition 1048572 262144 100\n"
    )
    (tmp_path / "sys/block/zram0").mkdir(parents=True)
    (tmp_path / "sys/block/zram0/mm_stat").write_text("garbage\n")
    got = gather(run=tmp_path / "run", cgroup_root=tmp_path / "cg", root=tmp_path,
                 board=tmp_path / "none.toml")  # fmt: skip
    assert ZRAM_CLAIM not in [c.name for c in got.slices]
    text = render(view(got.budget, got.slices, problems=got.notes))
    skipped = [line for line in text.splitlines() if line.startswith("skipped: ")]
    assert skipped == [
        f"skipped: {tmp_path}/sys/block/zram0/mm_stat: invalid literal for int() with base 10:"
        " 'garbage' (its zram pool is left out of the claims)"
    ]
