"""The command blocks of README.md and docs/: what a user would type, and what the page shows.

Every fenced block has a language. Two of them are commands:

- ``console``: lines starting with ``$ `` are commands (``> `` continues one); the lines after
  a command up to the next ``$ `` are its shown output, compared with what it prints (stdout
  and stderr together). In shown output a line that is only ``...`` stands for any number of
  lines, ``...`` inside a line for any text (times, pids), and a last line ``[exit N]`` says
  the command exits N (else it must exit 0).
- ``sh``: every line (joined across a trailing ``\\``) is a command that must exit 0, every
  command of a pipeline included (the runner's bash has ``pipefail``); its output is not
  shown, so not compared. A comment on the line is the reader's.

Any other block is not run, so it may not hold a ``$ `` line (a command the page shows and no
test runs: issue 43 found four whose output had drifted) unless it is marked skip.

The HTML comment right before a block says where it runs (nothing shown on the page):

- none: on the host (tests/docs/test_doc_blocks.py), the page's blocks in one shell, in order;
- ``<!-- docs: kernel -->``: in the kernel guest instead (tests/kernel/test_docs_guest.py: a
  real cgroup v2 kernel with every controller), the page's kernel blocks in one shell;
- ``<!-- docs: skip REASON -->``: not run, and the reason says why (a board, systemd as PID 1)
  and which test covers it instead.

Parsers take text (style.md 1): ``parse(text)`` is pure, ``parse_file`` a wrapper.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

COMMAND_LANGS = frozenset({"console", "sh"})
# the languages a non-command block may have: a block with none would hide a command
OTHER_LANGS = frozenset({"text", "toml", "yaml", "json", "ini", "promql", "diff", "python"})
FENCE = re.compile(r"^(?P<fence>```+)(?P<lang>[\w-]*)\s*$")
MARK = re.compile(r"^<!--\s*docs:\s*(?P<what>\w+)(?:\s+(?P<why>.*?))?\s*-->\s*$")
EXIT = re.compile(r"^\[exit (?P<code>\d+)\]$")
HOST, KERNEL, SKIP = "host", "kernel", "skip"


class BlockError(ValueError):
    """A block the runner cannot read (file:line in the message)."""


@dataclass(frozen=True)
class Command:
    line: int  # 1-based line in the file of the command's first line
    text: str  # the command as the shell gets it (continuations joined with newlines)
    output: tuple[str, ...] | None  # shown output (console), None when not shown (sh)
    exit_code: int = 0


@dataclass(frozen=True)
class Block:
    path: str
    line: int  # the opening fence's line (1-based)
    lang: str
    skip: str | None  # the reason, for a block marked skip
    commands: tuple[Command, ...] = field(default=())
    tier: str = HOST  # where it runs: HOST, KERNEL or SKIP

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _console(path: str, first: int, body: list[str]) -> tuple[Command, ...]:
    cmds: list[Command] = []
    i = 0
    while i < len(body):
        line = body[i]
        if not line.startswith("$ "):
            raise BlockError(f"{path}:{first + i}: console output before any `$ ` command")
        start = first + i
        text = [line[2:]]
        i += 1
        while i < len(body) and body[i].startswith("> "):
            text.append(body[i][2:])
            i += 1
        out: list[str] = []
        while i < len(body) and not body[i].startswith("$ "):
            out.append(body[i])
            i += 1
        code = 0
        if out and (m := EXIT.match(out[-1])):
            code = int(m["code"])
            out.pop()
        cmds.append(Command(start, "\n".join(text), tuple(out), code))
    return tuple(cmds)


def _sh(first: int, body: list[str]) -> tuple[Command, ...]:
    cmds: list[Command] = []
    text: list[str] = []
    start = first
    for i, line in enumerate(body):
        if not text:
            start = first + i
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        text.append(line)
        if not line.endswith("\\"):
            cmds.append(Command(start, "\n".join(text), None))
            text = []
    if text:
        cmds.append(Command(start, "\n".join(text), None))
    return tuple(cmds)


def parse(text: str, path: str) -> list[Block]:
    """Every fenced block of a Markdown page; command blocks with their commands."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        lang, fence, opened = m["lang"], m["fence"], i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != fence:
            j += 1
        if j == len(lines):
            raise BlockError(f"{path}:{opened + 1}: the block is never closed")
        if lang not in COMMAND_LANGS | OTHER_LANGS:
            raise BlockError(
                f"{path}:{opened + 1}: block language {lang or '(none)'!r}: commands are"
                f" `console` or `sh`, anything else one of {sorted(OTHER_LANGS)}"
            )
        skip: str | None = None
        tier = HOST
        k = opened - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0 and (mark := MARK.match(lines[k])):
            if mark["what"] == SKIP and mark["why"]:
                skip, tier = mark["why"], SKIP
            elif mark["what"] == KERNEL and not mark["why"]:
                tier = KERNEL
            else:
                raise BlockError(
                    f"{path}:{k + 1}: a mark is `<!-- docs: skip REASON -->` or"
                    " `<!-- docs: kernel -->`"
                )
        body = lines[opened + 1 : j]
        if lang not in COMMAND_LANGS and tier != SKIP:
            typed = next((n for n, b in enumerate(body) if b.lstrip().startswith("$ ")), None)
            if typed is not None:
                raise BlockError(
                    f"{path}:{opened + 2 + typed}: a `{lang}` block (line {opened + 1}) shows a"
                    " `$ ` command that is never run: make the block `console` (its output is"
                    " compared) or mark it `<!-- docs: skip REASON -->` naming the test that"
                    " covers it"
                )
        cmds: tuple[Command, ...] = ()
        if lang == "console":
            cmds = _console(path, opened + 2, body)
        elif lang == "sh":
            cmds = _sh(opened + 2, body)
        blocks.append(Block(path, opened + 1, lang, skip, cmds, tier))
        i = j + 1
    return blocks


def parse_file(path: Path, root: Path) -> list[Block]:
    return parse(path.read_text(), str(path.relative_to(root)))


def matches(shown: tuple[str, ...], got: list[str]) -> bool:
    """Whether the output got matches the shown lines (``...``: any lines / any text)."""
    pattern = []
    for line in shown:
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            parts = (re.escape(p) for p in line.rstrip().split("..."))
            pattern.append(r"[^\n]*?".join(parts) + r"[ \t]*\n")
    return re.fullmatch("".join(pattern), "".join(g.rstrip() + "\n" for g in got)) is not None
