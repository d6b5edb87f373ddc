"""The little roff (man(7) macros) the generated pages need: text escaped so that groff prints
it as written (a backslash, a minus that stays ASCII for copy and paste, a line that starts
with a dot)."""

from __future__ import annotations


def escape(text: str) -> str:
    out = text.replace("\\", "\\e").replace("-", "\\-")
    return f"\\&{out}" if out.startswith((".", "'")) else out


def bold(text: str) -> str:
    return f"\\fB{escape(text)}\\fR"


def paragraph(text: str) -> str:
    return f".PP\n{escape(text)}"


# commands, keys and values are copied from the page: no hyphen inside a word, ragged right
NO_HYPHENATION = (".nh", ".ad l")
