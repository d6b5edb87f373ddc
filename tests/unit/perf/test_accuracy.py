"""perf/accuracy.py's pure parts: the matrix goes on past a failing cell (reported in the table,
not counted in the worst over/under) and the summary's band and false refusals (the benchmark
itself runs in the kernel guest, not in CI)."""

from __future__ import annotations

import pytest

from perf.accuracy import CELLS, Cell, run_matrix, select, until
from perf.accuracy_report import BAND_FLOOR, MIB, Result, summary, table


def result(cell: Cell, estimate_mib: float, peak_mib: float) -> Result:
    return Result(cell.name, cell.name, int(estimate_mib * MIB), {}, int(peak_mib * MIB), 0, 0)


def test_a_failing_cell_is_reported_and_the_matrix_goes_on() -> None:
    cells = list(CELLS[:3])

    def run(cell: Cell) -> Result:
        if cell is cells[1]:
            raise RuntimeError(f"{cell.name}: exit 1; see log")
        return result(cell, 105, 100)

    got = run_matrix(cells, run)
    assert [r.cell for r in got] == [c.name for c in cells]
    assert got[1].error == f"RuntimeError: {cells[1].name}: exit 1; see log"
    assert not got[1].false_refusal and got[1].estimate == 0  # a failed cell measured nothing
    text = table(got)
    assert f"| {cells[1].name} |" in text and "FAILED: RuntimeError" in text
    assert text.splitlines()[-1].endswith(f"; FAILED 1: {cells[1].name}")


def test_the_summary_names_the_worst_both_ways_and_the_false_refusals() -> None:
    a, b, c, d = CELLS[:4]
    got = [result(a, 97, 100), result(b, 105, 100), result(c, 114, 100), result(d, 0, 0)]
    got[3].error = "OSError: gone"
    assert [r.verdict for r in got[:3]] == ["UNDER", "ok", "over band"]
    assert summary(got) == (
        f"cells 4; worst over {c.name} +14.0%; worst under {a.name} -3.0%;"
        f" false refusals 1: {c.name}; FAILED 1: {d.name}"
    )


def test_a_small_cell_is_allowed_the_floor_a_large_one_ten_percent() -> None:
    """Under 40 MiB the band's upper side is BAND_FLOOR (two 2 MiB huge pages), not 10 %."""
    a, b = CELLS[:2]
    floor = BAND_FLOOR / MIB
    small = [result(a, 31.2 + floor - 0.1, 31.2), result(a, 31.2 + floor + 0.1, 31.2)]
    assert [(r.verdict, r.false_refusal) for r in small] == [("ok", False), ("over band", True)]
    large = [result(b, 109.9, 100), result(b, 110.1, 100)]  # 10 % of 100 MiB is above the floor
    assert [(r.verdict, r.false_refusal) for r in large] == [("ok", False), ("over band", True)]
    assert result(b, 99.9, 100).verdict == "UNDER"  # the floor widens only the upper side


def test_repeated_cells_count_their_worst_peak_and_show_the_spread() -> None:
    a, b = CELLS[:2]
    peaks = {a.name: iter([30, 33, 31]), b.name: iter([40, 41])}
    order: list[str] = []

    def run(cell: Cell) -> Result:
        order.append(cell.name)
        if cell is b and len(order) == 4:
            raise RuntimeError("exit 1")  # one failed run of b: left out, b still counts
        return result(cell, 33.5, next(peaks[cell.name]))

    got = run_matrix([a, b], run, repeat=3)
    assert order == [a.name, b.name] * 3  # rounds of the matrix, not a cell three times
    assert [r.peak for r in got] == [33 * MIB, 41 * MIB]
    assert got[0].peaks == [30 * MIB, 33 * MIB, 31 * MIB] and len(got[1].peaks) == 2
    assert got[0].verdict == "ok"  # 33.5 over the worst 33, though 1.117 x the 30 MiB run
    assert not got[0].false_refusal and got[1].verdict == "UNDER"
    text = table(got)
    assert f"| {a.name} | 33.5 | 33.0 | 3: 30.0-33.0 |" in text
    assert f"| {b.name} | 33.5 | 41.0 | 2: 40.0-41.0 |" in text


def test_cells_run_in_the_order_cells_names_them() -> None:
    a, b, c = CELLS[:3]
    assert select(f"{c.name},{a.name},{c.name}") == [c, a, c]  # c twice: its runs merged
    got = run_matrix([c, a, c], lambda cell: result(cell, 33, 30 + len(cell.name)))
    assert [r.cell for r in got] == [c.name, a.name] and len(got[0].peaks) == 2
    with pytest.raises(SystemExit, match="unknown cells"):
        select(f"{b.name},nope")


def test_no_cell_starts_after_the_deadline_and_the_table_still_says_so() -> None:
    a, b = CELLS[:2]
    now = iter([0.0, 11.0])
    got = run_matrix([a, b], until(lambda c: result(c, 105, 100), 10.0, lambda: next(now)))
    assert got[0].verdict == "ok" and got[1].error == "RuntimeError: not run: --deadline passed"
    assert until(lambda c: result(c, 1, 1), None)(a).cell == a.name  # no deadline: every cell
