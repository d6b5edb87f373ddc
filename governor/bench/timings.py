"""Pure parser of llama.cpp's timing lines (text in, numbers out).

Three spellings of the same report, by llama.cpp version (notes/engine.md):

    common_perf_print: prompt eval time =  180.42 ms /  9 tokens ( 20.05 ms per token,  49.88 tokens per second)
    common_perf_print:        eval time =  577.08 ms / 15 runs   ( 38.47 ms per token,  25.99 tokens per second)
    llama_perf_context_print:  ...same fields (libllama; llama-simple prints it always)
    llama_print_timings:       ...same fields (older builds, before llama_perf_*)

Lines may carry a log timestamp prefix (``0.00.594.123 I``). "prompt eval" is prefill, "eval"
is decode. When several reports appear (common_perf_print and llama_perf_context_print both,
or one per run), the last of each kind wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREFIX = r"(?:common_perf_print|llama_perf_context_print|llama_print_timings)\s*:"
_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_EVAL_RE = re.compile(
    _PREFIX + r"\s*(?P<kind>prompt eval|eval) time\s*=\s*" + _NUM + r"\s*ms\s*/\s*"
    r"(?P<n>[0-9]+)\s*(?:tokens|runs)\s*\(.*?" + _NUM + r"\s*tokens per second\)"
)
_LOAD_RE = re.compile(_PREFIX + r"\s*load time\s*=\s*" + _NUM + r"\s*ms")


@dataclass(frozen=True)
class Timings:
    prefill_tps: float | None = None
    decode_tps: float | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    load_ms: float | None = None


def parse_timings(text: str) -> Timings:
    """Prefill and decode tokens/s from llama.cpp's stderr (None where a line is missing)."""
    found: dict[str, tuple[float, int, float]] = {}
    load: float | None = None
    for line in text.splitlines():
        m = _EVAL_RE.search(line)
        if m:
            ms, tps = float(m.group(2)), float(m.group(4))
            found[m["kind"]] = (ms, int(m["n"]), tps)
            continue
        lm = _LOAD_RE.search(line)
        if lm:
            load = float(lm.group(1))
    pre, dec = found.get("prompt eval"), found.get("eval")
    return Timings(
        prefill_tps=pre[2] if pre else None,
        decode_tps=dec[2] if dec else None,
        prefill_tokens=pre[1] if pre else None,
        decode_tokens=dec[1] if dec else None,
        prefill_ms=pre[0] if pre else None,
        decode_ms=dec[0] if dec else None,
        load_ms=load,
    )
