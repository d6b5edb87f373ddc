"""The board's budget and the pure admission arithmetic (issue 36, items 1 and 2), with fixture
boards: the 2 GiB kernel guest's figures and a QoS pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.board.budget import (
    GIB,
    MIB,
    Budget,
    admit,
    claim_of_plan,
    claim_problem,
    forced_text,
    gib,
    kept_text,
    no_budget_text,
    overlap_text,
    peak_of,
    refusal_text,
    reserve_for,
    short,
)
from governor.board.file import load_board, read_board
from governor.board.slice import QosClass, Slice
from governor.errors import PolicyError

BOARD_2G = Budget.of(2 * GIB)  # reserve 128 MiB + 128 MiB = 256 MiB: budget 1.75 GiB


def claim(
    name: str, cls: str, mn: int, peak: int, *, state: str = "running", **kw: object
) -> Slice:
    return Slice(
        name=name, cgroup=f"governor.slice/{name}", qos=QosClass(cls), min=mn, peak=peak,
        peak_source="max", state=state, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_the_reserve_is_128_mib_and_a_sixteenth_capped_at_1_gib() -> None:
    assert reserve_for(2 * GIB) == 256 * MIB
    assert reserve_for(1 * GIB) == 192 * MIB
    assert reserve_for(64 * GIB) == 1 * GIB
    assert BOARD_2G.budget == 2 * GIB - 256 * MIB
    assert Budget.of(2 * GIB, reserve=512 * MIB).budget == 1536 * MIB
    assert Budget.of(GIB, reserve=2 * GIB).budget == 0


def test_two_guarantees_over_the_budget_refuse_the_second_naming_the_first() -> None:
    batch = claim("npu-batch", "background", int(1.1 * GIB), int(1.5 * GIB))
    chat = claim("chat", "interactive", int(1.1 * GIB), int(1.6 * GIB))
    v = admit(BOARD_2G, chat, (batch,))
    assert v.kind == "guarantees" and not v.fits
    assert v.min_left == BOARD_2G.budget - int(1.1 * GIB)
    assert v.missing == int(1.1 * GIB) - v.min_left
    assert [h.name for h in v.holders] == ["npu-batch"]
    assert refusal_text(v) == (
        "the board cannot admit chat: memory.min 1126 MiB, 666 MiB of guarantees left,"
        " 461 MiB short (npu-batch holds 1126 MiB)"
    )
    # the background engine is of a lower class and yields "stop": a shed frees enough
    assert [c.name for c in v.victims] == ["npu-batch"] and v.enough


def test_guarantees_that_fit_with_overlapping_peaks_are_a_peak_verdict() -> None:
    batch = claim("npu-batch", "background", 300 * MIB, 1200 * MIB)
    chat = claim("chat", "interactive", 600 * MIB, 1000 * MIB)
    v = admit(BOARD_2G, chat, (batch,))
    assert v.kind == "peaks"
    assert v.missing == 1000 * MIB + 1200 * MIB - BOARD_2G.budget
    assert "chat would shed npu-batch" in overlap_text(v)
    assert refusal_text(v) == (
        "the board cannot admit chat: peak 1000 MiB (max), 592 MiB of peaks left, 408 MiB short"
        " (npu-batch claims 1200 MiB)"
    )


def test_claims_that_fit_are_admitted_and_name_no_victim() -> None:
    v = admit(BOARD_2G, claim("a", "standard", 200 * MIB, 600 * MIB),
              (claim("b", "standard", 200 * MIB, 600 * MIB),))  # fmt: skip
    assert v.fits and v.missing == 0 and v.victims == ()


def test_a_shed_never_takes_an_equal_or_higher_class_nor_one_that_does_not_yield_stop() -> None:
    others = (
        claim("peer", "interactive", 800 * MIB, 800 * MIB),
        claim("std", "standard", 300 * MIB, 300 * MIB),
        claim("frozen-only", "background", 100 * MIB, 100 * MIB, yields=("throttle", "freeze")),
        claim("stopped", "background", 100 * MIB, 100 * MIB, state="installed"),
    )
    new = claim("chat", "interactive", 800 * MIB, 800 * MIB)
    v = admit(BOARD_2G, new, others)
    assert v.kind == "guarantees"
    assert [c.name for c in v.victims] == ["std"]  # never peer (equal), nor the others
    bg = admit(BOARD_2G, claim("job", "background", 800 * MIB, 800 * MIB), others)
    assert bg.victims == () and not bg.enough


def test_victims_go_lowest_class_first_largest_first_until_enough() -> None:
    others = (
        claim("std", "standard", 500 * MIB, 500 * MIB),
        claim("bg-small", "background", 200 * MIB, 200 * MIB),
        claim("bg-big", "background", 600 * MIB, 600 * MIB),
    )
    v = admit(BOARD_2G, claim("chat", "interactive", 700 * MIB, 700 * MIB), others)
    # 1792 - 1300 = 492 MiB left; 208 MiB missing: the largest background alone frees it
    assert v.kind == "guarantees" and [c.name for c in v.victims] == ["bg-big"] and v.enough


def test_installed_claims_count_and_device_memory_counts_in_the_peak() -> None:
    installed = claim("tts", "standard", 1 * GIB, 1 * GIB, state="installed")
    v = admit(BOARD_2G, claim("chat", "interactive", 900 * MIB, 900 * MIB), (installed,))
    assert v.kind == "guarantees" and v.missing == 1 * GIB + 900 * MIB - BOARD_2G.budget
    assert "tts holds 1024 MiB, installed" in refusal_text(v)
    assert v.victims == ()  # not running: nothing to stop
    npu = claim("npu", "interactive", 512 * MIB, 512 * MIB, device=600 * MIB)
    assert npu.guaranteed == 512 * MIB and npu.peak_claim == 1112 * MIB
    v = admit(BOARD_2G, npu, (claim("b", "background", 100 * MIB, 800 * MIB),))
    assert v.kind == "peaks" and v.missing == 1112 * MIB + 800 * MIB - BOARD_2G.budget


def test_the_new_policys_own_earlier_claim_is_replaced_not_added() -> None:
    old = claim("chat", "interactive", 1 * GIB, 1 * GIB, state="installed")
    assert admit(BOARD_2G, claim("chat", "interactive", 1 * GIB, 1 * GIB), (old,)).fits


def test_the_peak_is_the_estimate_else_max_else_high_else_the_floor() -> None:
    assert peak_of(700, 900, 800) == (700, "estimate")
    assert peak_of(None, 900, 800) == (900, "max")
    assert peak_of(None, None, 800) == (800, "high")
    assert peak_of(None, None, None, 100) == (100, "none")
    unbounded = Slice(name="x", cgroup="g/x", qos=QosClass("standard"), min=300, peak=0,
                      peak_source="none")  # fmt: skip
    assert unbounded.peak_claim == 300  # never below its guarantee


def test_the_board_files_reserve_is_read_and_checked(tmp_path: Path) -> None:
    f = tmp_path / "board.toml"
    f.write_text('[board]\nreserve = "384MiB"\n')
    assert read_board(f).reserve == 384 * MIB and load_board(f) == ()
    f.write_text("[board]\nreserve = 402653184\n")
    assert read_board(f).reserve == 384 * MIB
    assert read_board(tmp_path / "none.toml").reserve is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[board]\nreserve = "lots"\n', "board.reserve"),
        ("[board]\nreserve = -1\n", "board.reserve"),
        ("[board]\nreserve = true\n", "board.reserve"),
        ('[board]\nreserve = "100GiB"\n', "board.reserve"),
        ('[board]\nreserv = "1G"\n', "board.reserv"),
        ('board = "1G"\n', "board"),
    ],
)
def test_a_bad_reserve_is_a_policy_error_naming_the_field(
    tmp_path: Path, text: str, field: str
) -> None:
    f = tmp_path / "board.toml"
    f.write_text(text)
    with pytest.raises(PolicyError) as err:
        load_board(f)
    assert err.value.field == field and err.value.exit_code == 65


def test_a_peak_above_the_budget_alone_is_no_overlap_and_the_overlap_is_at_most_the_others() -> (
    None
):
    big = claim("chat", "interactive", 1 * GIB, 2 * GIB)
    assert admit(BOARD_2G, big, ()).fits
    v = admit(BOARD_2G, big, (claim("tiny", "background", 0, 10 * MIB),))
    assert v.kind == "peaks" and v.missing == 10 * MIB


# ------------------------------------------------------------------ issue 43


def test_a_victim_whose_claim_stays_after_a_stop_is_never_counted_and_is_named() -> None:
    """Item 5: an `apply` slice (no supervisor: its state and memory.min stay), a `launch
    --keep` and a `governor monitor` keep their claim once their engine is stopped."""
    chat = claim("chat", "interactive", 1100 * MIB, 1100 * MIB)
    for why in ("apply", "launch --keep", "governor monitor"):
        held = claim("batch", "background", 1100 * MIB, 1100 * MIB, stays=why)
        v = admit(BOARD_2G, chat, (held,))
        assert v.kind == "guarantees" and v.victims == () and not v.enough
        assert [c.name for c in v.kept] == ["batch"]
        assert kept_text(v) == f"; batch's claim stays after a stop ({why})"
    # beside one that a stop frees: only that one is a victim, and it may not be enough
    v = admit(BOARD_2G, chat, (
        claim("applied", "background", 600 * MIB, 600 * MIB, stays="apply"),
        claim("job", "background", 500 * MIB, 500 * MIB),
    ))  # fmt: skip
    assert [c.name for c in v.victims] == ["job"] and v.enough  # 1792-1100 = 692: frees 500
    v = admit(BOARD_2G, chat, (
        claim("applied", "background", 900 * MIB, 900 * MIB, stays="apply"),
        claim("job", "background", 200 * MIB, 200 * MIB),
    ))  # fmt: skip
    assert [c.name for c in v.victims] == ["job"] and not v.enough


def test_sizes_below_2_gib_are_mib_and_a_refusal_says_the_shortfall() -> None:
    """Low item: 566 MiB left for a 600 MiB need read "0.6 GiB left"."""
    need = claim("chat", "interactive", 600 * MIB, 600 * MIB)
    v = admit(Budget.of(2 * GIB, reserve=2 * GIB - 966 * MIB), need,
              (claim("b", "standard", 400 * MIB, 400 * MIB),))  # fmt: skip
    assert refusal_text(v) == (
        "the board cannot admit chat: memory.min 600 MiB, 566 MiB of guarantees left,"
        " 34 MiB short (b holds 400 MiB)"
    )
    assert gib(2 * GIB) == "2.0 GiB" and gib(2 * GIB - MIB) == "2047 MiB"
    assert short(MIB + 1) == "2 MiB"  # rounded up: never "0 MiB short"


def test_a_reserve_that_leaves_no_budget_is_named_in_a_refusal_not_no_holder() -> None:
    zero = Budget.of(2 * GIB, reserve=2 * GIB)
    v = admit(zero, claim("chat", "interactive", 100 * MIB, 100 * MIB), ())
    assert no_budget_text(zero) == (
        "the reserve (2048 MiB) leaves no budget on this board (MemTotal 2048 MiB)"
    )
    assert refusal_text(v).endswith(
        "(the reserve (2048 MiB) leaves no budget on this board (MemTotal 2048 MiB))"
    )
    assert no_budget_text(BOARD_2G) is None and no_budget_text(Budget.of(0)) is None


def test_a_forced_guarantees_refusal_speaks_of_guarantees_not_peaks() -> None:
    batch = claim("npu-batch", "background", 1100 * MIB, 1100 * MIB)
    v = admit(BOARD_2G, claim("chat", "interactive", 1100 * MIB, 1100 * MIB), (batch,))
    assert "guarantees" in forced_text(v) and "peak" not in forced_text(v)
    v = admit(BOARD_2G, claim("chat", "interactive", 100 * MIB, 1700 * MIB), (batch,))
    assert v.kind == "peaks" and forced_text(v) == overlap_text(v)


def test_claims_from_a_file_refuse_sizes_no_plan_writes() -> None:
    """Item 7: the claim of a manifest's or a state's plan dict (claim_of_plan)."""

    def plan(value: object) -> dict[str, object]:
        g = "governor.slice/x"
        return {"policy": "x", "group": g,
                "writes": [{"cgroup": g, "file": "memory.min", "value": value}]}  # fmt: skip

    for bad in (-(1 << 40), True, 1.5e9, "-5", ["1"]):
        with pytest.raises(ValueError, match="is not a size"):
            claim_of_plan(plan(bad))
    assert claim_of_plan(plan(100)).min == 100 and claim_of_plan(plan("max")).min == 0
    huge = claim_of_plan(plan(64 * GIB))
    assert claim_problem(huge, 2 * GIB) is not None and claim_problem(huge, 0) is None
    assert claim_problem(claim_of_plan(plan(GIB)), 2 * GIB) is None
