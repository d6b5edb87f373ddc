"""Each guest test's budget (tests/vm/budgets.py): the table names real tests, the duration
report and the summary list a test over its budget, and that alone does not fail the tier."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vm import budgets, harness
from vm.junit import Case, Counts, TierResult, format_durations

ROOT = Path(__file__).resolve().parents[2]
SLOW = "tests.kernel.test_router_guest::test_evict_memory_unloads_the_lru_idle_model_before_a_load_that_would_not_fit"


def test_every_budgeted_test_exists_so_a_rename_cannot_drop_its_budget() -> None:
    for case_id, (seconds, reason) in budgets.TEST_BUDGETS.items():
        module, _, name = case_id.partition("::")
        path = ROOT / (module.replace(".", "/") + ".py")
        assert path.is_file(), case_id
        func = name.split("[", 1)[0]
        tree = ast.parse(path.read_text())
        defs = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert func in defs, f"{case_id}: no {func} in {path.relative_to(ROOT)}"
        if "[" in name:  # a parametrized test: its id is in the file, or a page it runs
            param = name.split("[", 1)[1].removesuffix("]")
            assert param in path.read_text() or (ROOT / param).is_file(), case_id
        assert seconds > budgets.DEFAULT_S and reason, case_id  # only what the default can't hold


def test_a_test_has_its_tables_budget_or_the_default_scaled_for_a_compat_tier() -> None:
    assert budgets.budget("kernel", SLOW) == budgets.TEST_BUDGETS[SLOW][0]
    other = "tests.kernel.test_launch_guest::test_x"
    assert budgets.budget("kernel", other) == budgets.DEFAULT_S
    assert budgets.budget("compat-5.10", other) == budgets.DEFAULT_S * 2.5
    assert budgets.budget("compat-6.12", other) == budgets.DEFAULT_S * budgets.COMPAT_SCALE
    assert budgets.budget("host", "tests.unit.test_x::test_y") is None  # not a guest test
    assert budgets.budget("lint", "mypy") is None


def _kernel(*cases: Case) -> TierResult:
    return TierResult("kernel", True, 100.0, counts=Counts(tests=len(cases)), cases=list(cases))


def test_an_over_budget_test_is_listed_with_its_numbers_and_the_tier_still_passes() -> None:
    limit = budgets.TEST_BUDGETS[SLOW][0]
    fast = Case("tests.kernel.test_a::test_fast", budgets.DEFAULT_S - 1)
    late = Case("tests.kernel.test_a::test_late", budgets.DEFAULT_S + 5)
    skipped = Case("tests.kernel.test_a::test_gone", budgets.DEFAULT_S + 9, "skipped")
    res = budgets.judge_tests(_kernel(fast, late, skipped, Case(SLOW, limit + 10)))
    assert res.ok  # a busy machine moves one test's time: the tier's budget is what fails
    assert res.over_budget == [(SLOW, limit + 10, limit), (late.id, late.time, budgets.DEFAULT_S)]
    report = format_durations([res], 100.0)
    listing = report[report.index("over their budget in tier kernel") :].splitlines()
    assert listing[1].split() == [f"{limit + 10:.1f}", f"{limit:.0f}", SLOW]
    assert listing[2].split() == [f"{late.time:.1f}", f"{budgets.DEFAULT_S:.0f}", late.id]
    assert len(listing) == 3
    (note,) = res.notes
    assert note.startswith("2 test(s) over their budget") and "test_late 65s > 60s" in note


def test_a_tier_within_every_budget_has_no_listing() -> None:
    res = budgets.judge_tests(_kernel(Case("tests.kernel.test_a::test_fast", 1.0)))
    assert res.over_budget == [] and res.notes == []
    assert "over their budget" not in format_durations([res], 1.0)


def test_the_run_reports_an_over_budget_guest_test_and_passes_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = Case(SLOW, budgets.TEST_BUDGETS[SLOW][0] + 1)

    def kernel(_o: object, tier: str, *_a: object) -> TierResult:
        return TierResult(tier, True, 10.0, counts=Counts(tests=1), cases=[slow])

    monkeypatch.delenv("GOVERNOR_TEST_STARTED", raising=False)
    monkeypatch.setattr(harness, "find_kernel", lambda: Path("/boot/vmlinuz-fake"))
    monkeypatch.setattr(harness, "detect_accel", lambda *_a: ("tcg", "requested"))
    monkeypatch.setattr(harness, "precompile", lambda **_k: None)
    monkeypatch.setattr(harness, "tier_qemu", kernel)
    monkeypatch.setenv("CI", "true")
    assert harness.main(["--tier", "kernel", "--results", str(tmp_path / "r")]) == 0
    durations = (tmp_path / "r" / "durations.txt").read_text()
    assert "over their budget in tier kernel" in durations and SLOW in durations
    assert "1 test(s) over their budget" in (tmp_path / "r" / "summary.txt").read_text()
    # --full is slower by design: no budget, no listing
    assert harness.main(["--tier", "kernel", "--full", "--results", str(tmp_path / "f")]) == 0
    assert "over their budget" not in (tmp_path / "f" / "durations.txt").read_text()
    capsys.readouterr()
