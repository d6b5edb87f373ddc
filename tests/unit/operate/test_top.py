"""`governor top` frames (governor/operate/top.py): rows from status snapshots, deltas, sorting."""

from __future__ import annotations

from typing import Any

from governor.operate.top import HEADER, Frame, frame_text, sort_rows


def _item(name: str, current: int, usage_usec: int, high_events: int, psi: float) -> dict[str, Any]:
    return {
        "policy": name,
        "state": "running",
        "knobs": [
            {"file": "memory.high", "kernel": str(1 << 30)},
            {"file": "memory.max", "kernel": "max"},
        ],
        "usage": {
            "memory": {"current": current, "anon": current // 2, "file": current // 2},
            "pressure": {"memory": {"some": {"avg10": psi}, "full": {"avg10": 0.0}}},
            "cpu": {"usage_usec": usage_usec, "throttled_usec": 0},
            "memory_events": {"high": high_events, "max": 0, "oom_kill": 0},
        },
        "rules": [{"state": "armed"}, {"state": "cooling down"}, {"state": "armed"}],
    }


def test_second_frame_has_cpu_percent_and_event_deltas() -> None:
    frame = Frame()
    first = frame.rows([_item("a", 512 << 20, 1_000_000, 3, 1.0)], now=100.0)
    assert first[0]["cpu"] is None and first[0]["events"]["high"] == 0
    (row,) = frame.rows([_item("a", 512 << 20, 1_500_000, 5, 1.0)], now=101.0)
    assert round(row["cpu"]) == 50  # 0.5 s of CPU in 1 s
    assert row["events"]["high"] == 2
    assert row["rules"] == "2 armed, 1 cooling down"
    assert row["high"] == 1 << 30 and row["max"] is None


def test_sorting_and_the_frame_text() -> None:
    frame = Frame()
    rows = frame.rows(
        [_item("small", 100 << 20, 0, 0, 9.0), _item("big", 900 << 20, 0, 0, 0.5)], now=1.0
    )
    assert [r["name"] for r in sort_rows(rows, "memory")] == ["big", "small"]
    assert [r["name"] for r in sort_rows(rows, "pressure")] == ["small", "big"]
    text = frame_text(rows, "memory", 1.0)
    lines = text.splitlines()
    assert lines[1] == HEADER
    assert lines[2].startswith("big") and "88" in lines[2]  # 900 MiB of a 1 GiB memory.high
    assert frame_text([], "cpu", 1.0).splitlines()[-1] == "(no governed slices)"


def test_the_frame_ends_with_the_boards_budget_and_claims() -> None:
    """Issue 36: the figures of `governor board` under the rows (status's budget)."""
    item = _item("a", 512 << 20, 0, 0, 0.0)
    item["budget"] = {
        "budget": 1792 << 20,
        "claimed": {"min": 724 << 20, "peak": 1900 << 20},
        "free": {"guarantees": 1068 << 20, "peaks": -(108 << 20)},
    }
    text = frame_text(Frame().rows([item], now=1.0), "memory", 1.0)
    assert text.splitlines()[-1] == (
        "board: budget 1.75GiB, claimed 724MiB min / 1.86GiB peak,"
        " free 1.04GiB for guarantees / -108MiB for peaks"
    )
    assert "board:" not in frame_text(
        Frame().rows([_item("a", 1, 0, 0, 0.0)], now=1.0), "memory", 1.0
    )
