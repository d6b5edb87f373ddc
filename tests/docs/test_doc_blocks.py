"""Every command block of README.md and docs/ runs, and prints what the page shows.

One test per page: the page's blocks not marked skip run in ONE bash process, in page order
(a block may use what an earlier one made: `$E`, chat.toml), in a scratch directory where the
repository's policies/, examples/ and tests/ are at hand as on a checkout, with the .venv's
`governor` on PATH and a private run dir and plan cache. A command whose output or exit code
differs from the page, or a block that no longer runs, fails the page with file:line.

The host has no memory controller on cgroup2 (see docs/troubleshooting.md): the pages say
`--allow-missing memory` where a user on such a host needs it. Blocks that need a board, systemd
as PID 1 or a guest carry `<!-- docs: skip REASON -->` naming the test that covers them.
Requirements (root, a cgroup2 mount, the engine cache of scripts/engine-setup): a missing one
fails under CI=true, else skips.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from engine import paths as engine
from vm import requirements

from docs import blocks

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md"]
    + [p for p in (REPO / "docs").rglob("*.md") if "reference" not in p.relative_to(REPO).parts]
)
LINKED = ("policies", "examples", "tests", "perf", "docs")
PAGE_TIMEOUT_S = 120
MARKER = "@@docs-block@@"
MARKER_RE = re.compile(rf"\n?{MARKER} (\d+) (\d+)\n")


def _script(cmds: list[blocks.Command]) -> str:
    lines = ["exec 2>&1", "exec </dev/null"]
    for n, c in enumerate(cmds):
        text = c.text.rstrip()
        if text.endswith("&") and not text.endswith("&&"):
            # a job the page starts in the background prints nothing the page shows; its
            # output would land in a later command's: it goes to a log the page cannot see
            # (exec: the job is the command itself, so `kill %1; wait %1` reach it)
            text = f"{{ exec {text[:-1].rstrip()}\n}} >>.docs-background.log 2>&1 &"
        lines.append(text)
        lines.append(f"printf '\\n{MARKER} {n} %d\\n' $?")
    lines.append("jobs -p | xargs -r kill 2>/dev/null; wait")
    return "\n".join(lines) + "\n"


def _chunks(out: str, count: int) -> dict[int, tuple[int, list[str]]]:
    got: dict[int, tuple[int, list[str]]] = {}
    pos = 0
    for m in MARKER_RE.finditer(out):
        text = out[pos : m.start()]
        lines = text.split("\n")
        while lines and not lines[-1].strip():
            lines.pop()
        got[int(m[1])] = (int(m[2]), lines)
        pos = m.end()
    assert len(got) <= count
    return got


def _page_ids() -> list[str]:
    return [str(p.relative_to(REPO)) for p in PAGES]


@pytest.mark.parametrize("page", _page_ids())
def test_every_block_has_a_language_and_marks_are_well_formed(page: str) -> None:
    blocks.parse_file(REPO / page, REPO)  # raises BlockError with file:line


@pytest.mark.parametrize("page", _page_ids())
def test_page_commands_run_and_print_what_the_page_shows(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cmds = [c for b in blocks.parse_file(REPO / page, REPO) if b.skip is None for c in b.commands]
    if not cmds:
        return  # a page without commands to run (every one is marked skip, or none)
    reasons = requirements.kernel_reasons(controllers=(), root=True, psi=True)
    if any("$E" in c.text or str(engine.CACHE) in c.text for c in cmds):
        reasons += requirements.engine_reasons(engine.COMPLETION, paths=(engine.TINY, engine.BIG))
    requirements.enforce(reasons)
    work = tmp_path / "work"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(REPO / name)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["GOVERNOR_CACHE_DIR"] = str(tmp_path / "cache")
    env["NO_COLOR"] = "1"
    env.pop("GOVERNOR_METRICS", None)
    proc = subprocess.Popen(
        ["bash", "-c", _script(cmds)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    finally:
        # a background engine the page started and did not stop
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    got = _chunks(out, len(cmds))
    problems: list[str] = []
    for n, c in enumerate(cmds):
        where = f"{page}:{c.line}: $ {c.text.splitlines()[0]}"
        if n not in got:
            problems.append(f"{where}: did not finish (page timeout {PAGE_TIMEOUT_S}s?)")
            break
        code, lines = got[n]
        if code != c.exit_code:
            tail = "\n    ".join(lines[-8:])
            problems.append(f"{where}: exit {code}, the page says {c.exit_code}\n    {tail}")
        elif c.output is not None:
            shown = list(c.output)
            while shown and not shown[-1].strip():
                shown.pop()
            if not blocks.matches(tuple(shown), lines):
                problems.append(
                    f"{where}: output differs\n  page:\n    "
                    + "\n    ".join(shown)
                    + "\n  got:\n    "
                    + "\n    ".join(lines)
                )
    assert not problems, (
        f"{len(problems)} block command(s) of {page} fail:\n"
        + "\n".join(problems)
        + "\n(script: "
        + shlex.quote(str(work))
        + ")"
    )
