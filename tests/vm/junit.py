"""Reading pytest's JUnit XML: counts, per-test cases (time, outcome, skip reason), the tier
judge, and the per-tier summary table."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vm import skips


@dataclass
class Counts:
    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def passed(self) -> int:
        return max(0, self.tests - self.failures - self.errors - self.skipped)


@dataclass(frozen=True)
class Case:
    """One <testcase>: `id` is classname::name (or a lint step's name), `time` the seconds
    pytest recorded (setup + call + teardown), `outcome` passed|failed|error|skipped|xfail,
    `reason` the skip/xfail message."""

    id: str
    time: float
    outcome: str = "passed"
    reason: str = ""


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


def _outcome(tc: ET.Element) -> tuple[str, str]:
    for tag, outcome in (("error", "error"), ("failure", "failed")):
        if tc.find(tag) is not None:
            return outcome, ""
    sk = tc.find("skipped")
    if sk is not None:
        kind = "xfail" if sk.get("type") == "pytest.xfail" else "skipped"
        return kind, sk.get("message") or (sk.text or "").strip()
    return "passed", ""


def parse_cases(path: Path) -> list[Case]:
    """Every <testcase> of the file, in file order. A test interrupted by the tier's time
    limit leaves a nameless <testcase>: it is listed as "(interrupted test)".

    Raises OSError / ET.ParseError when the file is missing or unreadable.
    """
    root = ET.parse(path).getroot()
    out: list[Case] = []
    for tc in root.iter("testcase"):
        cls, name = tc.get("classname", ""), tc.get("name", "")
        ident = f"{cls}::{name}" if cls and name else (name or cls or "(interrupted test)")
        try:
            t = float(tc.get("time", "0") or 0)
        except ValueError:
            t = 0.0
        outcome, reason = _outcome(tc)
        out.append(Case(ident, t, outcome, reason))
    return out


@dataclass
class TierResult:
    tier: str
    ok: bool
    wall: float
    counts: Counts | None = None
    notes: list[str] = field(default_factory=list)
    cases: list[Case] = field(default_factory=list)  # per test (per step for lint)
    budget: float | None = None  # seconds the tier may take (judge_budget); None: not held to one
    # (test id, measured s, budget s) of each test over its own budget (vm.budgets.judge_tests)
    over_budget: list[tuple[str, float, float]] = field(default_factory=list)
    # CPU seconds (user + sys) of the tier's process (a guest's qemu) and what it reaped;
    # against `wall`, the host cores it kept busy (None: not measured)
    cpu: float | None = None


# pytest exit codes (pytest.ExitCode) and what they mean for a tier; 124 is timeout(1)'s, which
# the guests wrap pytest in
PYTEST_EXIT = {
    0: "ok",
    1: "tests failed",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
    124: "stopped at the tier's time limit",
}


def judge_pytest(
    tier: str,
    rc: int | None,
    junit: Path,
    wall: float,
    *,
    ci: bool = False,
    allowed: tuple[skips.Allowed, ...] = skips.ALLOWED,
) -> TierResult:
    """A tier passes only if pytest exited 0 AND the junit file shows at least one test AND,
    when `ci`, every skipped (or xfailed) test's reason is on the allow list
    (tests/vm/skips.py): in CI a skip must not hide a test."""
    res = TierResult(tier, ok=False, wall=wall)
    if rc is None:
        res.notes.append(
            "no exit code came back (stopped at its time limit, or the guest failed to boot "
            "or to finish)"
        )
    elif rc != 0:
        res.notes.append(f"pytest exit {rc} ({PYTEST_EXIT.get(rc, 'error')})")
    try:
        res.counts = parse_junit(junit)
        res.cases = parse_cases(junit)
    except (OSError, ET.ParseError) as exc:
        res.notes.append(f"no junit result ({exc.__class__.__name__}: {junit})")
    if res.counts is not None and res.counts.tests == 0 and rc != 5:
        res.notes.append("junit lists no tests")
    hidden = [
        c
        for c in res.cases
        if c.outcome in ("skipped", "xfail") and skips.allowed(tier, c.reason, allowed) is None
    ]
    if hidden:
        how = "fail the tier (CI=true)" if ci else "would fail it under CI=true"
        res.notes.append(f"{len(hidden)} skip(s) not on the allow list in tests/vm/skips.py {how}:")
        res.notes += [f"  {c.outcome} {c.id}: {c.reason or '(no reason)'}" for c in hidden[:20]]
        if len(hidden) > 20:
            res.notes.append(f"  ... and {len(hidden) - 20} more (see the junit xml)")
    res.ok = rc == 0 and res.counts is not None and res.counts.tests > 0 and not (ci and hidden)
    return res


def judge_budget(res: TierResult, budget: float | None, *, ci: bool = False) -> TierResult:
    """Hold a tier to its budget (seconds of wall time, well under its timeout): a tier that
    took longer fails when `ci`, so a slow test is seen in the run that adds it, not when the
    tier's timeout starts cutting tests; without `ci` the overrun is a note."""
    res.budget = budget
    if budget is None or res.wall <= budget:
        return res
    how = "fails the tier (CI=true)" if ci else "would fail it under CI=true"
    res.notes.append(
        f"took {res.wall:.0f}s, over its budget of {budget:.0f}s (TIER_BUDGETS in "
        f"tests/vm/harness.py) {how}: trim the slowest tests in the duration report, or raise "
        "the budget with the measured reason"
    )
    if ci:
        res.ok = False
    return res


def _cell(v: float | None, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


def format_table(results: list[TierResult], total_wall: float) -> str:
    """One row per tier: its outcome, counts, measured wall time, CPU time (user + sys of its
    process: a guest's qemu) and budget ("-": none)."""
    head = ("tier", "result", "passed", "failed", "skipped", "errors", "wall s", "cpu s",
            "budget s")  # fmt: skip
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
                _cell(r.cpu, "{:.1f}"),
                _cell(r.budget, "{:.0f}"),
            )
        )
    overall = "ok" if results and all(r.ok for r in results) else "FAIL"
    rows.append(("total", overall, "", "", "", "", f"{total_wall:.1f}", "", ""))
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


def format_durations(
    results: list[TierResult],
    total_wall: float,
    *,
    phases: Sequence[tuple[str, float]] = (),
    budget: float | None = None,
    top: int = 15,
) -> str:
    """The run's duration report: wall time per phase (setup, guest preparation) and per tier
    (with its CPU time and the host cores that makes on average, when measured), then the
    `top` slowest tests of each tier (from its junit xml; the steps for lint)."""
    budgets = {f"tier {r.tier}": r.budget for r in results}
    cpus = {f"tier {r.tier}": (r.cpu, r.wall) for r in results if r.cpu is not None}
    rows = [*phases, *((f"tier {r.tier}", r.wall) for r in results), ("total", total_wall)]
    width = max(len(n) for n, _ in rows)
    out = ["durations (wall seconds)"]
    for name, secs in rows:
        line = f"  {name.ljust(width)}  {secs:8.1f}"
        if name in cpus:
            cpu, wall = cpus[name]
            line += f"   cpu {cpu:.1f}s = {cpu / wall if wall > 0 else 0.0:.2f} cores"
        tier_budget = budgets.get(name)
        if tier_budget is not None:
            over = "  OVER" if secs > tier_budget else ""
            line += f"   (budget {tier_budget:.0f}s{over})"
        if name == "total" and budget is not None:
            line += f"   (budget {budget:.0f}s = {budget / 60:.0f} min, from the start of setup)"
        out.append(line)
    for r in results:
        if not r.cases:
            continue
        slow = sorted(r.cases, key=lambda c: c.time, reverse=True)[:top]
        out += ["", f"slowest {len(slow)} of {len(r.cases)} in tier {r.tier}:"]
        for c in slow:
            tag = "" if c.outcome == "passed" else f"  [{c.outcome}]"
            out.append(f"  {c.time:8.1f}  {c.id}{tag}")
    for r in results:
        if r.over_budget:
            head = f"over their budget in tier {r.tier} (measured s, budget s; vm/budgets.py):"
            out += ["", head]
            out += [f"  {t:8.1f} {b:6.0f}  {i}" for i, t, b in r.over_budget]
    return "\n".join(out)
