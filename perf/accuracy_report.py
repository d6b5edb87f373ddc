"""perf/accuracy.py's results: one cell's measurement (or several: `--repeat`), its verdict
against the band, and the table and summary docs/benchmarks.md shows. Pure: no engine runs here.

With repeats a cell's peak is the WORST (largest) memory.peak of its runs: the estimate must be
at or above every run's peak (never under), and a false refusal is judged against the limit
the worst run needed."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20
BAND = 0.10  # at most 10 % over, never under
# ... or this much over where 10 % is less (a cell under 40 MiB): memory.peak moves in 2 MiB
# transparent huge pages, and the tiny text cells' peaks moved 2-4 MiB between identical runs
# (docs/benchmarks.md, run 3), wider than 10 % of ~31 MiB; two huge pages
BAND_FLOOR = 4 * MIB
STAT_KEYS = ("file_mapped", "kernel", "kernel_stack", "pagetables", "slab", "sock", "shmem")


@dataclass
class Result:
    cell: str
    argv: str
    estimate: int
    terms: dict[str, int]
    peak: int  # with repeats: the largest of peaks
    anon: int  # memory.stat at the end of the run
    file: int
    prompt_tokens: list[int] = field(default_factory=list)
    oom_kill: int = 0
    wall_s: float = 0.0
    # memory.stat's other charged kinds at the end of the run (STAT_KEYS) and the engine's own
    # files' page cache after it (fincore: what the run read of its binary and libraries)
    stat: dict[str, int] = field(default_factory=dict)
    engine_files: dict[str, int] = field(default_factory=dict)
    error: str = ""  # the cell failed: why (reported in the table, not fatal)
    peaks: list[int] = field(default_factory=list)  # every run's memory.peak (--repeat)

    @property
    def slack(self) -> float:
        """How far above the peak the band goes: 10 %, or BAND_FLOOR for a small cell."""
        return max(self.peak * BAND, BAND_FLOOR)

    @property
    def ratio(self) -> float:
        return self.estimate / self.peak if self.peak else 0.0

    @property
    def verdict(self) -> str:
        if self.error:
            return f"FAILED: {self.error}"
        if self.ratio < 1.0:
            return "UNDER"
        return "over band" if self.estimate > self.peak + self.slack else "ok"

    @property
    def false_refusal(self) -> bool:
        return bool(self.peak) and self.estimate > self.peak + self.slack  # failed: no peak

    @property
    def spread(self) -> str:
        """min-max of the runs' peaks in MiB ("" for a single run)."""
        if len(self.peaks) < 2:
            return ""
        return f"{min(self.peaks) / MIB:.1f}-{max(self.peaks) / MIB:.1f}"


def failed(name: str, program: Path, argv: tuple[str, ...], error: str) -> Result:
    """A cell that did not run to its measurement (reported as such, the matrix goes on)."""
    return Result(name, shlex.join([program.name, *argv]), 0, {}, 0, 0, 0, error=error)


def merge(runs: list[Result]) -> Result:
    """One cell's repeated runs as one result: the worst run's (largest peak) measurement with
    every run's peak in ``peaks``. A failed run is left out (its line says why); a cell none of
    whose runs ran is its first failure."""
    ran = [r for r in runs if not r.error]
    if not ran:
        return runs[0]
    worst = max(ran, key=lambda r: r.peak)
    worst.peaks = [r.peak for r in ran]
    worst.wall_s = sum(r.wall_s for r in runs)
    return worst


def table(results: list[Result]) -> str:
    """The markdown table docs/benchmarks.md shows (its source), with the summary line."""
    lines = [
        "| cell | estimate MiB | memory.peak MiB | runs: peak min-max MiB | anon / file MiB | ratio"
        " | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        runs = f"{len(r.peaks)}: {r.spread}" if r.spread else str(len(r.peaks) or 1)
        lines.append(
            f"| {r.cell} | {r.estimate / MIB:.1f} | {r.peak / MIB:.1f} | {runs} |"
            f" {r.anon / MIB:.0f} / {r.file / MIB:.0f} | {r.ratio:.3f} | {r.verdict} |"
        )
    lines += ["", summary(results)]
    return "\n".join(lines)


def summary(results: list[Result]) -> str:
    """cells, worst over and under, false refusals, failed cells (not counted in the worst)."""
    ran = [r for r in results if not r.error]
    bad = [r.cell for r in results if r.error]
    out = f"cells {len(results)}"
    if ran:
        over = max(ran, key=lambda r: r.ratio)
        under = min(ran, key=lambda r: r.ratio)
        refused = [r.cell for r in ran if r.false_refusal]
        out += (
            f"; worst over {over.cell} {over.ratio - 1:+.1%};"
            f" worst under {under.cell} {under.ratio - 1:+.1%};"
            f" false refusals {len(refused)}{': ' + ', '.join(refused) if refused else ''}"
        )
    return out + (f"; FAILED {len(bad)}: {', '.join(bad)}" if bad else "")
