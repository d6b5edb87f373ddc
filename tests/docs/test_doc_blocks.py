"""Every command block of README.md and docs/ runs, and prints what the page shows (host tier).

One test per page: the page's host blocks run in ONE bash, in page order (a block may use what
an earlier one made: `$E`, chat.toml), through tests/docs/runner.py. A command whose output or
exit code differs from the page, or a block that no longer runs, fails the page with
file:line. How blocks are written and marked: docs/development.md, "The manual and its
examples".

The host has no memory controller on cgroup2: the pages say `--allow-missing memory` where a
user on such a host needs it. Blocks marked `<!-- docs: kernel -->` run in the kernel guest
(tests/kernel/test_docs_guest.py); `<!-- docs: skip REASON -->` name the test that covers them.
Requirements (root, a cgroup2 mount with PSI, and for pages that use it the engine cache of
scripts/engine-setup): a missing one fails under CI=true, else skips.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from engine import paths as engine
from vm import requirements

from docs import blocks, runner

PAGE_TIMEOUT_S = 120
PAGES = [str(p.relative_to(runner.REPO)) for p in runner.pages()]


@pytest.mark.parametrize("page", PAGES)
def test_every_block_has_a_language_and_marks_are_well_formed(page: str) -> None:
    blocks.parse_file(runner.REPO / page, runner.REPO)  # raises BlockError with file:line


def test_the_pages_have_commands_to_run() -> None:
    """A reader or a regex gone wrong cannot make every page pass by running nothing."""
    counts = {
        tier: sum(len(runner.commands(runner.REPO / p, tier)) for p in PAGES)
        for tier in (blocks.HOST, blocks.KERNEL)
    }
    assert counts[blocks.HOST] >= 50 and counts[blocks.KERNEL] >= 5, counts


@pytest.mark.parametrize("page", PAGES)
def test_page_commands_run_and_print_what_the_page_shows(page: str, tmp_path: Path) -> None:
    cmds = runner.commands(runner.REPO / page, blocks.HOST)
    if not cmds:
        return  # a page without host commands (every one is marked, or none)
    reasons = requirements.kernel_reasons(controllers=(), root=True, psi=True)
    if any("$E" in c.text or str(engine.CACHE) in c.text for c in cmds):
        reasons += requirements.engine_reasons(engine.COMPLETION, paths=(engine.TINY, engine.BIG))
    requirements.enforce(reasons)
    problems = runner.run(page, cmds, tmp_path / "work", PAGE_TIMEOUT_S)
    assert not problems, f"{len(problems)} command(s) of {page} differ from the page:\n" + (
        "\n".join(problems)
    )


def test_the_commands_page_names_every_command() -> None:
    """docs/commands.md lists each command `governor --help` has (the README listed `top`
    twice, one of them stale, and `apply`/`remove` not at all)."""
    done = subprocess.run(
        [sys.executable, "-m", "governor", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    names = re.findall(r"^  (\w+)\s{2,}", done.stdout.split("Commands:", 1)[1], re.MULTILINE)
    page = (runner.REPO / "docs" / "commands.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `governor ")]
    missing = [n for n in names if not any(f"`governor {n}" in r for r in rows)]
    twice = [n for n in names if sum(r.startswith(f"| `governor {n} ") for r in rows) > 1]
    assert len(names) >= 20 and not missing and not twice, (names, missing, twice)


README_MAX_LINES = 250  # the manual issue's limit (issue 48: it had grown back to 292)


def test_the_readme_stays_a_front_page() -> None:
    """The README is the front page, the manual is docs/: it stays within README_MAX_LINES,
    keeps its two set-up commands (the main job on a bundled example, and all tests) and
    links every page of the manual's table it had."""
    text = (runner.REPO / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"
    )
    assert "scripts/demo\n" in text and "scripts/test\n" in text
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)", text))
    assert {"docs/fit.md", "docs/launch.md", "docs/server.md", "docs/several.md"} <= linked
    assert all((runner.REPO / page).is_file() for page in linked), linked
