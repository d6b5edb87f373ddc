"""`governor board` (issue 36, governor/operate/boardview.py): the board's table from fixture
claims, its big ungoverned cgroups from a tmp cgroup tree, and `--fits` with its victims.
Needs: a tmp directory (no kernel)."""

from __future__ import annotations

from pathlib import Path

from governor.board.budget import Budget
from governor.board.file import BoardCgroup
from governor.board.slice import QosClass, Slice
from governor.kernel.cgroupfs import CgroupFs
from governor.operate.boardview import fits, render, ungoverned, view

MIB = 1 << 20
# a 2 GiB board: reserve 128 MiB + 2048/16 = 256 MiB, budget 1792 MiB
BUDGET = Budget.of(2048 * MIB)
CHAT = Slice(
    name="chat", cgroup="governor.slice/chat", qos=QosClass("interactive"), min=400 * MIB,
    peak=700 * MIB, peak_source="estimate", current=512 * MIB,
)  # fmt: skip
BATCH = Slice(
    name="batch", cgroup="governor.slice/batch", qos=QosClass("background"), min=0,
    peak=950 * MIB, peak_source="max", current=600 * MIB, yields=("throttle", "freeze", "stop"),
)  # fmt: skip
TTS = Slice(
    name="tts", cgroup="governor.slice/tts", qos=QosClass("standard"), min=100 * MIB,
    peak=300 * MIB, peak_source="high", state="installed",
)  # fmt: skip


def test_the_board_adds_up_every_claim_running_or_installed() -> None:
    v = view(BUDGET, [TTS, BATCH, CHAT])
    assert (v["memtotal"], v["reserve"], v["budget"]) == (2048 * MIB, 256 * MIB, 1792 * MIB)
    assert v["claimed"] == {"min": 500 * MIB, "peak": 1950 * MIB}
    # the peaks overcommit by 158 MiB: a negative free, the shed arbitrates
    assert v["free"] == {"guarantees": 1292 * MIB, "peaks": -158 * MIB}
    rows = [(s["name"], s["state"], s["min"], s["peak"], s["peak_source"]) for s in v["slices"]]
    assert rows == [
        ("batch", "running", 0, 950 * MIB, "max"),
        ("chat", "running", 400 * MIB, 700 * MIB, "estimate"),
        ("tts", "installed", 100 * MIB, 300 * MIB, "high"),
    ]
    text = render(v)
    assert text.splitlines()[0] == "board: MemTotal 2048 MiB, reserve 256 MiB, budget 1792 MiB"
    assert "free: 1292 MiB for guarantees, -158 MiB for peaks" in text
    assert (
        "tts              standard       100 MiB       300 MiB (high)         -  installed" in text
    )


def test_big_ungoverned_top_level_cgroups_and_board_entries_are_listed(tmp_path: Path) -> None:
    sizes = {
        "system.slice": 300 * MIB,
        "user.slice": 40 * MIB,
        "init.scope": 2 * MIB,  # small: no row
        "governor.slice": 1100 * MIB,  # governed
        "docker": 200 * MIB,  # a container runtime's own top-level cgroup
        "system.slice/camera.service": 5 * MIB,  # small, but in the board file
    }
    for cg, n in sizes.items():
        (tmp_path / cg).mkdir(parents=True)
        (tmp_path / cg / "memory.current").write_text(f"{n}\n")
    cam = BoardCgroup(
        name="camera", path="system.slice/camera.service", qos_class="background", yields=()
    )
    rows = ungoverned(CgroupFs(tmp_path), [CHAT], [cam])
    assert [(r["cgroup"], r["class"], r["current"]) for r in rows] == [
        ("system.slice", None, 300 * MIB),
        ("docker", None, 200 * MIB),
        ("user.slice", None, 40 * MIB),
        ("system.slice/camera.service", "background", 5 * MIB),
    ]


def test_fits_says_yes_when_both_checks_pass() -> None:
    small = Slice(
        name="small", cgroup="governor.slice/small", qos=QosClass("standard"), min=100 * MIB,
        peak=200 * MIB, peak_source="estimate",
    )  # fmt: skip
    out = fits(BUDGET, small, [CHAT], "warn")
    assert out["fits"] and out["check"] == "fits"
    assert out["line"].startswith("yes: small fits")


def test_fits_under_shed_names_the_lower_class_victims_only() -> None:
    big = Slice(
        name="chat2", cgroup="governor.slice/chat2", qos=QosClass("standard"), min=200 * MIB,
        peak=900 * MIB, peak_source="estimate",
    )  # fmt: skip
    out = fits(BUDGET, big, [CHAT, BATCH], "shed")
    assert not out["fits"] and out["check"] == "peaks"
    # 1792 - 700 - 950 = 142 MiB of peaks left: 758 MiB missing; only batch ranks below
    assert out["missing"] == 758 * MIB
    assert out["victims"] == ["batch"] and out["enough"]
    assert out["line"].endswith('admit = "shed" would stop batch')
    warn = fits(BUDGET, big, [CHAT, BATCH], "warn")
    assert warn["victims"] == [] and warn["line"].endswith("would start it with a warning")


def test_fits_refuses_guarantees_that_overcommit_naming_who_holds_them() -> None:
    greedy = Slice(
        name="greedy", cgroup="governor.slice/greedy", qos=QosClass("interactive"), min=1500 * MIB,
        peak=1500 * MIB, peak_source="max",
    )  # fmt: skip
    out = fits(BUDGET, greedy, [CHAT, BATCH], "refuse")
    assert out["check"] == "guarantees" and out["missing"] == 108 * MIB
    assert out["holders"] == ["chat"]
    assert out["line"].startswith("no: greedy lacks 108 MiB of guarantees (chat holds 400 MiB)")
    assert out["line"].endswith('admit = "refuse" would refuse it (75)')
