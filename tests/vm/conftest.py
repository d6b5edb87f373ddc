"""The harness's own tests (tests/vm/test_*.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _not_the_hosting_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests parse their own options: the settings of the `scripts/test` run that hosts
    them (--full, --timeout, --deadline, --overlap, --parallel, exported to the host tier; CI
    exports GOVERNOR_TEST_OVERLAP=1) must not leak in."""
    for name in (
        "GOVERNOR_TEST_FULL", "GOVERNOR_VM_TIMEOUT", "GOVERNOR_TEST_DEADLINE",
        "GOVERNOR_TEST_OVERLAP", "GOVERNOR_TEST_PARALLEL",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
