"""RKLLM (Rockchip's NPU runtime for LLMs): the argv of its demo and the device memory it needs.

airockchip/rknn-llm's demo takes positional arguments: ``llm_demo MODEL.rkllm MAX_NEW_TOKENS
MAX_CONTEXT_LEN``. The runtime loads the .rkllm file into NPU memory, which the vendor rknpu
driver allocates contiguously (dma_alloc_attrs, DMA_ATTR_FORCE_CONTIGUOUS): charged to no
memory cgroup, so memory.max does not bound it. The governor budgets it at preflight instead
(``[device] memory``, by default the .rkllm file's size: governor/backends/device.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from governor.errors import PolicyError, PolicyNotFound
from governor.record import record

KIND = "rkllm"


INT32_MAX = (1 << 31) - 1  # the demo reads its counts into C ints
_DIGITS = frozenset("0123456789")


def _count(text: str) -> int | None:
    """A positive count in ASCII digits within int32; None otherwise. str.isdigit() takes
    other scripts' digits and superscripts, which int() then refuses or reads as a number the
    demo never sees; a string of over 4300 digits is refused by int() itself."""
    if not text or not set(text) <= _DIGITS or len(text.lstrip("0")) > len(str(INT32_MAX)):
        return None
    n = int(text)
    return n if 0 < n <= INT32_MAX else None


@record(frozen=True)
class RkllmArgs:
    model: Path
    max_new_tokens: int | None
    max_context_len: int | None


def parse_rkllm_argv(argv: Sequence[str]) -> RkllmArgs:
    """``llm_demo MODEL [MAX_NEW_TOKENS [MAX_CONTEXT_LEN]]`` (argv[0] is the program); 65
    when the model is missing or a count is not a positive integer."""
    if len(argv) < 2:
        raise PolicyError(
            "an rkllm engine needs its model: llm_demo MODEL.rkllm MAX_NEW_TOKENS MAX_CONTEXT_LEN",
            file="engine argv",
            field="engine.kind",
            hint="pass the .rkllm file as the first argument, or set engine.kind to another kind",
        )
    counts: list[int | None] = []
    for name, text in zip(
        ("MAX_NEW_TOKENS", "MAX_CONTEXT_LEN"), (*argv[2:4], None, None), strict=False
    ):
        n = None if text is None else _count(text)
        if text is not None and n is None:
            raise PolicyError(
                f"rkllm {name} must be a positive integer up to {INT32_MAX}, got {text[:40]!r}",
                file="engine argv",
                field=name,
                hint="llm_demo MODEL.rkllm MAX_NEW_TOKENS MAX_CONTEXT_LEN",
            )
        counts.append(n)
    return RkllmArgs(model=Path(argv[1]), max_new_tokens=counts[0], max_context_len=counts[1])


def check_rkllm(argv: Sequence[str], max_context_tokens: int | None) -> tuple[Path, int]:
    """The model path and its size: 66 when it is missing, 65 above engine.max_context_tokens."""
    args = parse_rkllm_argv(argv)
    cap = args.max_context_len
    if max_context_tokens is not None and (cap is None or cap > max_context_tokens):
        asked = "no MAX_CONTEXT_LEN" if cap is None else f"MAX_CONTEXT_LEN {cap}"
        raise PolicyError(
            f"rkllm {asked} exceeds engine.max_context_tokens = {max_context_tokens}",
            file="engine argv",
            field="engine.max_context_tokens",
            hint=f"pass MAX_CONTEXT_LEN {max_context_tokens} or less as the third argument",
        )
    try:
        size = args.model.stat().st_size
    except OSError as err:
        raise PolicyNotFound(
            f"model file not found: {args.model} ({err.strerror})",
            file="engine argv",
            field="MODEL",
            hint="the .rkllm file is llm_demo's first argument",
        ) from err
    return args.model, size
