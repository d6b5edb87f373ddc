"""The docs' blocks that need a real cgroup v2 kernel (`<!-- docs: kernel -->`) run here, in the
kernel guest, and print what the page shows (kernel tier). The host tier runs the rest
(tests/docs/test_doc_blocks.py); both go through tests/docs/runner.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from docs import blocks, runner

PAGE_TIMEOUT_S = 600  # TCG: each governor start is seconds here
PAGES = [
    str(p.relative_to(runner.REPO)) for p in runner.pages() if runner.commands(p, blocks.KERNEL)
]


@pytest.mark.kernel(controllers=("memory", "cpu"), root=True)
@pytest.mark.parametrize("page", PAGES)
def test_page_kernel_blocks_print_what_the_page_shows(page: str, tmp_path: Path) -> None:
    cmds = runner.commands(runner.REPO / page, blocks.KERNEL)
    problems = runner.run(page, cmds, tmp_path / "work", PAGE_TIMEOUT_S)
    assert not problems, f"{len(problems)} command(s) of {page} differ from the page:\n" + (
        "\n".join(problems)
    )
