"""`governor init` for an RKLLM model (issue 45 item 6): a policy whose NPU memory claim
(``[device] memory``) is RKLLM's estimate (governor/engines/rkllm_memory.py: never under
Rockchip's RK3588 table, within +10 % on six of its nine rows), refused (75) when that claim
does not fit the NPU's address space beside the RKLLM instances already running, as admission
refuses their launch (governor/board/npu.py).

The estimate needs the model's parameters and quantisation: a .rkllm file's header is
Rockchip's own (no documented fields), so they are read from the file's name, which
rknn-llm's converter and model zoo spell ``Qwen2.5-1.5B-Instruct_W8A8_RK3588.rkllm``
(:func:`name_facts`). A name without them leaves the claim at the file's size (what
``[device] memory`` is by default for an rkllm engine), said in the policy's comment.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from governor.board.npu import NPU_DOMAIN_BYTES, npu_refusal
from governor.engines.rkllm_memory import MB_PER_MPARAM, estimate_bytes
from governor.errors import AdmissionRefused, PolicyNotFound
from governor.init.draft import Request, policy_name
from governor.policy.loader import load_text

SUFFIX = ".rkllm"
PROGRAM = "llm_demo"  # rknn-llm's demo: llm_demo MODEL MAX_NEW_TOKENS MAX_CONTEXT_LEN
DEFAULT_CTX = 2048  # policies/npu-chat.toml's max_context_tokens
NEW_TOKENS = 512  # MAX_NEW_TOKENS the draft passes (at most the context)
MIB = 1 << 20
# `1.5B`, `0.5B`, `7B`, `135M` between separators (not `RK3588`, not `v2`)
_PARAMS_RE = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)([BbMm])(?![A-Za-z0-9])")
_DTYPES = sorted(MB_PER_MPARAM, key=len, reverse=True)  # w4a16_g128 before w4a16


def is_rkllm_model(model: Path) -> bool:
    return model.suffix.lower() == SUFFIX


def name_facts(name: str) -> tuple[int, str] | None:
    """(parameters, dtype) a .rkllm file's name says (pure); None when it says not both."""
    low = name.lower()
    dtype = next((d for d in _DTYPES if re.search(rf"(?<![a-z0-9]){d}(?![a-z0-9])", low)), None)
    found = _PARAMS_RE.findall(name)
    if dtype is None or len(found) != 1:
        return None
    number, unit = found[0]
    return int(float(number) * (1e9 if unit in "Bb" else 1e6)), dtype


@dataclass(frozen=True)
class RkllmSizing:
    ctx: int  # MAX_CONTEXT_LEN and engine.max_context_tokens
    npu: int  # [device] memory
    source: str  # where npu comes from
    board: int  # MemTotal (or --board-memory)


@dataclass(frozen=True)
class RkllmDraft:
    name: str
    text: str
    engine: tuple[str, ...]
    sizing: RkllmSizing
    missing: tuple[str, ...] = ()


def claim(model: Path) -> tuple[int, str]:
    """The NPU memory to claim for ``model`` and where it comes from (module docstring)."""
    try:
        size = model.stat().st_size
    except OSError as err:
        raise PolicyNotFound(
            f"cannot read the model: {err.strerror}", file=str(model), hint="check --model"
        ) from err
    facts = name_facts(model.name)
    est = None if facts is None else estimate_bytes(*facts)
    if facts is None or est is None:
        return size, "the .rkllm file's size: its name gives no parameter count and quantisation"
    params, dtype = facts
    return (
        est,
        f"RKLLM's estimate for {params / 1e9:.2f}B parameters at {dtype}, from the file's name",
    )


def draft_rkllm(req: Request, *, board: int, others: list[tuple[str, int]]) -> RkllmDraft:
    """The policy for ``req.model`` beside ``others`` (name, NPU bytes: the running RKLLM
    instances); AdmissionRefused (75) when its claim does not fit the NPU beside them."""
    name = policy_name(req, SUFFIX)
    npu, source = claim(req.model)
    others = [(n, b) for n, b in others if n != name]  # a policy of this name replaces its own
    said = npu_refusal(name, npu, others)
    if said is not None:
        raise AdmissionRefused(
            f"{said} ({source}; --model {req.model})",
            hint="stop the other RKLLM engine first, or choose a smaller model",
        )
    ctx = req.ctx or DEFAULT_CTX
    words = list(req.engine_argv)
    program = words[0] if words else PROGRAM
    engine = (program, str(req.model), str(min(NEW_TOKENS, ctx)), str(ctx))
    beside = ", ".join(f"{n} {b >> 20} MiB" for n, b in others) or "none"
    text = "\n".join(
        [
            f"# governor init: {req.model.name} under RKLLM (engine.kind = rkllm)",
            f"#   NPU memory {npu >> 20} MiB: {source}",
            f"#   the NPU's {NPU_DOMAIN_BYTES >> 30} GiB address space, running RKLLM"
            f" instances: {beside}",
            f"#   governor launch --policy {req.output or 'POLICY'} -- {shlex.join(engine)}",
            f'name = "{name}"',
            f'description = "RKLLM {req.model.name} at MAX_CONTEXT_LEN {ctx} (governor init)"',
            "",
            "[engine]",
            'kind = "rkllm"              # llm_demo MODEL.rkllm MAX_NEW_TOKENS MAX_CONTEXT_LEN',
            f"max_context_tokens = {ctx}   # the demo's MAX_CONTEXT_LEN is held to this",
            "",
            "[prefetch]",
            'mode = "none"               # the NPU runtime reads the model itself',
            "",
            "[device]",
            f'memory = "{-(-npu // MIB)}MiB"     # {source}',
            'pool = "system"             # MemAvailable minus the other slices\' memory.min',
            "",
        ]
    )
    load_text(text, source=str(req.output or "<init>"))  # what init writes always loads
    return RkllmDraft(name, text, engine, RkllmSizing(ctx, npu, source, board))
