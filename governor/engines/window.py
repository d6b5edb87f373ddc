"""The sliding window (issue 45 item 5): a chat engine whose context is capped needs
``--context-shift``, or a conversation that reaches ``-c`` fails instead of shifting.

llama.cpp keeps context shift off by default (tools/common/arg.cpp ``--context-shift``, "use
context shift on infinite text generation", default disabled): when a conversation fills the
context, llama-server answers the request with an error ("the request exceeds the available
context size") and llama-cli / llama-completion stop. With it the oldest tokens after
``--keep`` are dropped and the conversation goes on: the seed's "static hard cap + sliding
window". A chat engine here is llama-server, or llama-cli / llama-completion in conversation
(their default; ``-no-cnv`` / ``--no-conversation`` is a one-shot run). The words are walked
with llama.cpp's option grammar (governor/plan/llama_args.py), so a prompt that reads
"--context-shift" is no flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from governor.plan.llama_args import options

CONTEXT_SHIFT = "--context-shift"
_SHIFT = {CONTEXT_SHIFT: True, "--no-context-shift": False}
_CONVERSATION = {"-cnv": True, "--conversation": True, "-no-cnv": False, "--no-conversation": False}
CHAT_CLIS = ("llama-cli", "llama-completion")


def _last(argv: Sequence[str], table: dict[str, bool]) -> bool | None:
    said = None
    for opt in options(argv[1:]):
        if opt.name in table:
            said = table[opt.name]
    return said


def is_chat(argv: Sequence[str]) -> bool:
    """llama-server, or llama-cli / llama-completion in conversation (the default)."""
    if not argv:
        return False
    name = Path(argv[0]).name
    if name.startswith("llama-server"):
        return True
    return name.startswith(CHAT_CLIS) and _last(argv, _CONVERSATION) is not False


def shifts(argv: Sequence[str]) -> bool:
    """Whether the argv turns context shift on (the last of --context-shift / --no-...)."""
    return bool(_last(argv, _SHIFT))


def needs_shift(argv: Sequence[str]) -> bool:
    """A chat engine without context shift, and not told off explicitly (init adds it)."""
    return is_chat(argv) and _last(argv, _SHIFT) is None


def no_shift_warning(argv: Sequence[str], cap: int | None, qos_class: str) -> str | None:
    """`check`'s warning: an interactive policy caps the context of a chat engine that does not
    shift (None: not interactive, no cap, no chat engine, or it shifts)."""
    if qos_class != "interactive" or cap is None or not is_chat(argv) or shifts(argv):
        return None
    return (
        f"the context is capped (engine.max_context_tokens = {cap}) and the chat engine runs"
        f" without {CONTEXT_SHIFT}: a conversation that reaches -c fails instead of sliding"
        f" (llama.cpp keeps context shift off by default); pass {CONTEXT_SHIFT}"
    )
