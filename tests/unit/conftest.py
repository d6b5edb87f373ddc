"""Unit-tier configuration: the hypothesis profiles and the fuzzers' reach report.

Profiles (``HYPOTHESIS_PROFILE`` picks one; otherwise "ci" when CI=true, else "dev"):

    ci   derandomized: every CI run draws the same examples, so a failure in the log replays
         with the same command; no example database (the guest's tree is read-only)
    dev  random examples, kept in .hypothesis/ so a failure found locally is tried first next time

Both print the @reproduce_failure blob of a failing example and have no deadline: a test never
depends on how fast a loaded 2-core machine runs it.

``report_reach(line)`` (fixture): a fuzz test prints how far its examples got; the lines are
repeated in the terminal summary, so the host tier's log shows them without -s.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Iterator

import pytest
from hypothesis import settings

# hypothesis's own default, not whatever is loaded now (hypothesis loads its built-in "ci"
# profile at import when any CI variable is set, even CI=false)
_DEFAULT = settings.get_profile("default")
settings.register_profile(
    "ci", _DEFAULT, derandomize=True, database=None, print_blob=True, deadline=None
)
settings.register_profile("dev", _DEFAULT, print_blob=True, deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")
)

_REACH = pytest.StashKey[list[str]]()


@pytest.fixture
def report_reach(request: pytest.FixtureRequest) -> Callable[[str], None]:
    lines = request.config.stash.setdefault(_REACH, [])

    def report(line: str) -> None:
        print(line)
        lines.append(line)

    return report


@pytest.fixture
def memory_cap() -> Iterator[None]:
    """The test's address space capped 512 MiB above what it uses now: a regression that reads
    /dev/zero to EOF fails with a MemoryError instead of taking the host's memory (the bounded
    reads of issue 43: tests/unit/operate/test_peer_files.py, engines/test_preset_read.py)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    lines = config.stash.get(_REACH, [])
    if lines:
        terminalreporter.section("fuzz reach")
        for line in lines:
            terminalreporter.write_line(line)
