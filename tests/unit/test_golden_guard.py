"""Goldens are never rewritten under CI (tests/helpers/golden.py): GOVERNOR_UPDATE_GOLDEN=1 with
CI=true fails the test that would rewrite, and leaves the file as it was.

Needs: the repository (runs one golden test in a pytest subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.golden import update_requested

REPO = Path(__file__).resolve().parents[2]


def test_update_is_asked_only_by_the_variable_and_never_under_ci() -> None:
    assert update_requested({}) is False
    assert update_requested({"GOVERNOR_UPDATE_GOLDEN": "0", "CI": "true"}) is False
    assert update_requested({"GOVERNOR_UPDATE_GOLDEN": "1"}) is True
    assert update_requested({"GOVERNOR_UPDATE_GOLDEN": "1", "CI": "false"}) is True
    for ci in ("true", "1", "yes"):
        with pytest.raises(pytest.fail.Exception, match="never rewrites"):
            update_requested({"GOVERNOR_UPDATE_GOLDEN": "1", "CI": ci})


def test_a_golden_test_under_ci_with_update_fails_and_writes_nothing(tmp_path: Path) -> None:
    golden = REPO / "policies" / "schema.json"
    before = golden.read_bytes(), golden.stat().st_mtime_ns
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env.update(CI="true", GOVERNOR_UPDATE_GOLDEN="1")
    proc = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--junitxml={tmp_path / 'j.xml'}",
            "tests/unit/cli/test_schema.py::test_committed_schema_matches_governor_schema",
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "never rewrites" in proc.stdout
    assert (golden.read_bytes(), golden.stat().st_mtime_ns) == before
