"""perf/accuracy.py's pure parts: the matrix goes on past a failing cell (reported in the table,
not counted in the worst over/under) and the summary's band and false refusals (the benchmark
itself runs in the kernel guest, not in CI)."""

from __future__ import annotations

from perf.accuracy import CELLS, MIB, Cell, Result, run_matrix, summary, table


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
