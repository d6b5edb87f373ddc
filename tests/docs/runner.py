"""Run a page's commands in one bash and say where they differ from the page.

The host tier (tests/docs/test_doc_blocks.py) and the kernel guest (tests/kernel/
test_docs_guest.py) run their blocks through this: in a scratch directory where the
repository's policies/, examples/ and tests/ are at hand as on a checkout, with the venv's
`governor` on PATH and the plan cache in the scratch directory. A background job (a command
ending in `&`) prints into a log; the page does not show its output.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from docs import blocks

REPO = Path(__file__).resolve().parents[2]
LINKED = ("policies", "examples", "tests", "perf", "docs")
MARKER = "@@docs-block@@"
MARKER_RE = re.compile(rf"\n?{MARKER} (\d+) (\d+)\n")


def pages() -> list[Path]:
    """README.md and docs/, less the generated reference (its blocks are examples of keys)."""
    docs = [
        p for p in (REPO / "docs").rglob("*.md") if "reference" not in p.relative_to(REPO).parts
    ]
    return sorted([REPO / "README.md", *docs])


def commands(page: Path, tier: str) -> list[blocks.Command]:
    return [c for b in blocks.parse_file(page, REPO) if b.tier == tier for c in b.commands]


def script(cmds: list[blocks.Command]) -> str:
    # pipefail: `governor board | head` fails when governor does (an sh line's exit code is all
    # the runner sees of it, and `false | true` exits 0 without it)
    lines = ["exec 2>&1", "exec </dev/null", "set -o pipefail"]
    for n, c in enumerate(cmds):
        text = c.text.rstrip()
        if text.endswith("&") and not text.endswith("&&"):
            # its output would land in a later command's: it goes to a log the page cannot
            # see (exec: the job is the command itself, so `kill %1; wait %1` reach it)
            text = f"{{ exec {text[:-1].rstrip()}\n}} >>.docs-background.log 2>&1 &"
        lines.append(text)
        lines.append(f"printf '\\n{MARKER} {n} %d\\n' $?")
    lines.append("jobs -p | xargs -r kill 2>/dev/null; wait")
    return "\n".join(lines) + "\n"


def chunks(out: str) -> dict[int, tuple[int, list[str]]]:
    """Each command's exit code and output lines (trailing blank lines dropped)."""
    got: dict[int, tuple[int, list[str]]] = {}
    pos = 0
    for m in MARKER_RE.finditer(out):
        lines = out[pos : m.start()].split("\n")
        while lines and not lines[-1].strip():
            lines.pop()
        got[int(m[1])] = (int(m[2]), lines)
        pos = m.end()
    return got


def run(page: str, cmds: list[blocks.Command], work: Path, timeout: float) -> list[str]:
    """Run ``cmds`` in ``work``; one problem per command that differs from the page."""
    work.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        (work / name).symlink_to(REPO / name)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["GOVERNOR_CACHE_DIR"] = str(work / ".cache")
    env["NO_COLOR"] = "1"
    env.pop("GOVERNOR_METRICS", None)
    proc = subprocess.Popen(
        ["bash", "-c", script(cmds)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    finally:
        # a background engine the page started and did not stop
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    got = chunks(out)
    problems: list[str] = []
    for n, c in enumerate(cmds):
        where = f"{page}:{c.line}: $ {c.text.splitlines()[0]}"
        if n not in got:
            problems.append(f"{where}: did not finish (the page's {timeout:g}s ran out?)")
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
    return problems
