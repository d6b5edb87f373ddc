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


def test_the_scan_gives_a_router_slice_its_models_measured_reload_seconds(tmp_path: Path) -> None:
    """Issue 46 item 2: the victim order weighs what a slice costs to bring back: a router's
    published load seconds (RunState.reload_s), read once with the rest of the slice."""
    from fakefs.plans import make_plan

    from governor.rundir.state import Publisher, applied

    root = _board(tmp_path, "0 0 0 0 0\n")
    plan = replace(
        make_plan(policy="r", group="g/r", leaf="g/r/engine"), cgroup_root=str(root / "cg")
    )
    (root / "cg" / "g" / "r").mkdir(parents=True)  # an applied slice holds while its group exists
    state = applied(plan, policy_path=None, created=[], started_at=1.0)
    models = {"a": {"last_request": 5.0, "load_s": 2.0}, "b": {"last_request": None, "load_s": 3.5}}
    router = {"url": "http://127.0.0.1:1", "models": models}
    Publisher(root / "run", "r").publish({**state.to_json(), "router": router})
    got = scan(run=root / "run", cgroup_root=root / "cg", root=root, board=root / "none.toml")
    (r,) = [s for s in got.slices if s.name == "r"]
    assert (r.reload_s, r.active_at) == (5.5, 5.0)
