"""Counting results in pytest's JUnit XML and printing the per-tier summary table."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Counts:
    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def passed(self) -> int:
        return max(0, self.tests - self.failures - self.errors - self.skipped)


def parse_junit(path: Path) -> Counts:
    """Sum the counters of all <testsuite> elements (root may be <testsuites> or <testsuite>).

    Raises OSError / ET.ParseError when the file is missing or unreadable.
    """
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    c = Counts()
    for s in suites:
        c.tests += int(s.get("tests", "0"))
        c.failures += int(s.get("failures", "0"))
        c.errors += int(s.get("errors", "0"))
        c.skipped += int(s.get("skipped", "0"))
    return c


@dataclass
class TierResult:
    tier: str
    ok: bool
    wall: float
    counts: Counts | None = None
    notes: list[str] = field(default_factory=list)


# pytest exit codes (pytest.ExitCode) and what they mean for a tier
PYTEST_EXIT = {
    0: "ok",
    1: "tests failed",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
}


def judge_pytest(tier: str, rc: int | None, junit: Path, wall: float) -> TierResult:
    """A tier passes only if pytest exited 0 AND the junit file shows at least one test."""
    res = TierResult(tier, ok=False, wall=wall)
    if rc is None:
        res.notes.append("no exit code came back (guest failed to boot or to finish)")
    elif rc != 0:
        res.notes.append(f"pytest exit {rc} ({PYTEST_EXIT.get(rc, 'error')})")
    try:
        res.counts = parse_junit(junit)
    except (OSError, ET.ParseError) as exc:
        res.notes.append(f"no junit result ({exc.__class__.__name__}: {junit})")
    if res.counts is not None and res.counts.tests == 0 and rc != 5:
        res.notes.append("junit lists no tests")
    res.ok = rc == 0 and res.counts is not None and res.counts.tests > 0
    return res


def _cell(v: int | None) -> str:
    return "-" if v is None else str(v)


def format_table(results: list[TierResult], total_wall: float) -> str:
    head = ("tier", "result", "passed", "failed", "skipped", "errors", "wall s")
    rows: list[tuple[str, ...]] = []
    for r in results:
        c = r.counts
        rows.append(
            (
                r.tier,
                "ok" if r.ok else "FAIL",
                _cell(c.passed if c else None),
                _cell(c.failures if c else None),
                _cell(c.skipped if c else None),
                _cell(c.errors if c else None),
                f"{r.wall:.1f}",
            )
        )
    overall = "ok" if results and all(r.ok for r in results) else "FAIL"
    rows.append(("total", overall, "", "", "", "", f"{total_wall:.1f}"))
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]

    def line(cols: tuple[str, ...]) -> str:
        return "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cols, widths, strict=True))
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    out = [line(head), sep, *(line(r) for r in rows[:-1]), sep, line(rows[-1])]
    notes = [f"  {r.tier}: {n}" for r in results for n in r.notes]
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)
