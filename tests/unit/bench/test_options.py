"""`governor bench` refuses what would only fail (or mislead) after every run: NaN and absurd
numbers, output files it cannot write; and a generic engine's argv is not read as llama.cpp's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from governor.api.bench import _check_bench_options
from governor.bench.main import BenchOptions, _cases
from governor.errors import GovernorError, PolicyNotFound, UsageError


@pytest.mark.parametrize(
    "change",
    [
        {"interval": 1e308},
        {"interval": float("nan")},
        {"max_fraction": float("nan")},
        {"max_fraction": float("inf")},
        {"min_decode_tps": float("nan")},
        {"timeout": -1.0},
        {"ctxs": (-5,)},
        {"ctxs": (10**400,)},
    ],
)
def test_absurd_numbers_are_usage_errors_before_any_run(change: dict[str, object]) -> None:
    with pytest.raises(UsageError) as err:
        _check_bench_options(replace(BenchOptions(), **change))  # type: ignore[arg-type]
    assert err.value.hint


@pytest.mark.parametrize("option", ["csv", "json"])
def test_an_output_that_cannot_be_written_is_refused_before_any_run(
    tmp_path: Path, option: str
) -> None:
    def opts(path: Path) -> BenchOptions:
        return BenchOptions(csv=path) if option == "csv" else BenchOptions(json=path)

    with pytest.raises(PolicyNotFound):
        _check_bench_options(opts(tmp_path / "no" / "x"))
    with pytest.raises(UsageError):
        _check_bench_options(opts(tmp_path))
    _check_bench_options(opts(tmp_path / "ok"))


def test_a_generic_engine_runs_its_argv_as_given() -> None:
    plan = SimpleNamespace(engine=SimpleNamespace(kind="generic"))
    (case,) = _cases(plan, ("/bin/sh", "-c", "true"), BenchOptions())
    assert case.argv == ("/bin/sh", "-c", "true") and case.ctx is None and case.model is None
    with pytest.raises(GovernorError):
        _cases(plan, ("/bin/sh", "-c", "true"), BenchOptions(ctxs=(512,)))


def test_a_llama_engine_still_expands_the_matrix() -> None:
    plan = SimpleNamespace(engine=SimpleNamespace(kind="llama.cpp"))
    cases = _cases(plan, ("llama-cli", "-m", "a.gguf"), BenchOptions(ctxs=(512, 1024)))
    assert [c.ctx for c in cases] == [512, 1024]
