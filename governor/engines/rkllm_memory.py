"""RKLLM's memory (issue 45 item 6): an estimate from the model's parameters and quantisation,
the runtime's own ``memory_usage_mb`` read from its output, and the NPU address space a second
instance shares with the first.

The estimate, in the runtime's MB (``memory(MB)`` of Rockchip's table, ``memory_usage_mb`` of
its perf stats; the same unit both ways):

    memory = RUNTIME_MB + MB_PER_MPARAM[dtype] x parameters in millions

fitted to Rockchip's published RK3588 table (airockchip/rknn-llm ``benchmark.md``, RKLLM 1.3.0:
w8a8, seqlen 128, 64 new tokens) with the rows whose exact parameter count is in the models'
configs (tests/unit/engines/test_rkllm_memory.py holds them) as the least maximum over-estimate
that is NEVER under a row: an NPU claim below what the runtime takes lets a second instance in
that then segfaults (rknn-llm issue 522), one above it only refuses that instance. Six of nine
rows are within +0..10 %; TinyLLAMA-1.1B (+20.1 %), InternLM2-1.8B (+20.0 %) and ChatGLM3-6B
(+10.9 %) are not, and no line in the parameter count can hold them: the table is not a
function of it (Qwen2.5-1.5B takes 1.094 MB per million parameters, InternLM2-1.8B, 22 % larger,
0.940 and only 5 % more memory; the vocabulary's size does not explain it either), and a
.rkllm file's name gives nothing else. The w4a16 figures are RK3576's rows of the same table
(RK3588 lists w8a8 only), their runtime term the w8a8 fit's (not checked against a table).

The NPU address space: rknpu maps a process's buffers into an IOMMU domain of 4 GiB
(``extend_param.base_domain_id``; llm_demo leaves every instance in domain 0), so instances in
one domain share 4 GiB whatever the board's RAM: a second Qwen3-4B fails "failed to malloc npu
memory" (rknn-llm issue 437), and runtime 1.3.0 segfaults instead (issue 522). Admission
refuses such a second instance (75) before it starts (governor/board/npu.py: the run
time's, a cached launch never imports engines/).
"""

from __future__ import annotations

import math
import re

MB = 1 << 20  # the runtime's MB: it divides bytes by 1024 x 1024
RUNTIME_MB = 175.0  # librkllmrt, the tokenizer and the NPU's working buffers at seqlen 128
# MB per million parameters (w8a8: never under an RK3588 row, the least worst over; w4a16:
# RK3576's rows)
MB_PER_MPARAM: dict[str, float] = {"w8a8": 1.035, "w4a16": 0.47, "w4a16_g128": 0.50}

# `memory_usage_mb: 1093.66` / `memory_usage_mb = 1093.66` (RKLLMPerfStat printed by a demo)
# and the runtime's own perf table: `Peak Memory Usage (GB)` with the figure on the next line
_USAGE_RE = re.compile(r"memory_usage_mb\s*[:=]\s*(?P<mb>\d+(?:\.\d+)?)")
_PEAK_GB_RE = re.compile(r"Peak Memory Usage \(GB\)[^\n]*\n[^\n\d]*(?P<gb>\d+(?:\.\d+)?)")


def estimate_bytes(parameters: int, dtype: str) -> int | None:
    """RKLLM's memory for a model of ``parameters`` at ``dtype`` (None: a dtype not in the
    table: the .rkllm file's size stays the device claim)."""
    per = MB_PER_MPARAM.get(dtype.lower())
    if per is None or parameters <= 0:
        return None
    return math.ceil((RUNTIME_MB + per * parameters / 1e6) * MB)  # up: never under


def parse_memory_usage(text: str) -> int | None:
    """The runtime's reported memory in bytes (the last report in ``text``; None: none)."""
    found = [float(m["mb"]) * MB for m in _USAGE_RE.finditer(text)]
    found += [float(m["gb"]) * 1024 * MB for m in _PEAK_GB_RE.finditer(text)]
    return int(found[-1]) if found else None
