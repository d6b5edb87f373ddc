"""Resident memory of llama.cpp for a GGUF model and an argv, before anything runs (pure).

    total = weights + repack + KV cache + compute (touched part) + engine + margin

- weights: the tensor data, as file pages (mmap, the default; llama.cpp maps with MAP_POPULATE,
  src/llama-mmap.cpp) or as an anonymous copy (``-lm none``). Charged to the cgroup that first
  faults them (cgroup-v2.rst "Memory Ownership"), so the estimate is for a cold page cache.
- repack: ggml-cpu copies repackable matmul weights into an anonymous CPU_REPACK buffer at
  load (ggml/src/ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type); with mmap the
  file pages stay populated too, so these bytes count twice. ``-nr`` turns it off.
  token_embd is read with GET_ROWS and never repacked.
- KV cache: 2 (K and V) x n_layer x cells x n_embd_kv x bytes per element of -ctk/-ctv, cells =
  -c rounded up to 256 (llama-context.cpp pads n_ctx). Counted whole: the warmup run clears
  (memsets) it, and without warmup (--no-warmup) it fills as the context does, so a full
  context reaches the same size (measured: docs/calibration.md).
- compute buffer: reserved for a worst-case ubatch, dominated by vocab x n_ubatch f32 logits
  (305 MiB for a 151936 vocab at -ub 512, notes/engine.md) but mostly never touched: only the
  rows of tokens that need logits are written. It is printed, and counted at
  COMPUTE_TOUCHED_SHARE, its logits part up to LOGITS_COUNTED_MAX.
- engine: the engine's binary and the libraries beside it, file pages read at exec and charged
  like the model's on a cold cache (governor/engines/engine_files.py; docs/calibration.md).
- margin: libc/OpenMP arenas, thread stacks, page tables and the C++/OpenMP runtime libraries;
  measured (docs/calibration.md).

llama-server adds slots, its prompt cache and context checkpoints: governor/engines/server.py.
The options both read, resolved to numbers, are governor/engines/settings.py's Settings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from governor.engines import projector, server
from governor.engines.gguf import GgufInfo
from governor.engines.settings import KV_CELL_PAD, Settings

MIB = 1 << 20
# memory.peak minus the other terms in the kernel guest (perf/accuracy.py, docs/calibration.md):
# the engine's own anon (libc/OpenMP arenas, thread stacks, page tables: ~8 MiB under the
# guest's THP=always) and the C++/OpenMP runtimes it loads (libstdc++, libgomp, libgcc_s:
# 2.5 MiB, charged on a cold cache where no other process maps them) (llama.cpp b11312), plus
# 1.5 MiB for the run-to-run spread: that anon moves in 2 MiB huge pages, and the tiny text
# cells' worst runs reached 1.2 MiB above 11 MiB (docs/benchmarks.md, accuracy run 3)
MARGIN_BYTES = 25 * MIB // 2
# the engine's files when its program is not found on disk (a bare name): scripts/engine-setup's
# llama-server (b11312, x86-64-v3, static), 14.3 MiB, the largest of its binaries
# (llama-completion 10.7, llama-mtmd-cli 12.4 MiB)
ENGINE_FILE_BYTES = 15 * MIB
# share of the reserved compute buffer that is written: ggml's allocator reuses the buffer for
# the graph's intermediates, but the logits part (vocab x ubatch) is written only for tokens
# that need logits. Measured as memory.peak's anon beyond KV, repack and margin in the kernel
# guest (perf/accuracy.py): 35-38 % for the tiny and small models (9 and 66.5 MiB reserved):
# the larger share, so the estimate is not under for a small model
COMPUTE_TOUCHED_SHARE = 0.45
# the logits part counted at most this much (then the share): a later ubatch whose tensors fit
# the reserved ones keeps their offsets (ggml-alloc.c ggml_gallocr_needs_realloc), so what is
# written of the logits is the output rows (one per sequence), not a share of vocab x ubatch.
# The 1.1 GiB model (vocab 151936: 297 of its 305 MiB are logits) wrote ~46 MiB in all
# (docs/calibration.md), 15 % of its reserve; 128 MiB is a 64k vocab's logits at -ub 512, above
# every model whose share was measured (vocab 32000: 62.5 MiB), so those keep the share
LOGITS_COUNTED_MAX = 128 * MIB

# bytes per element of KV cache types (-ctk/-ctv): block size / elements per block (ggml.c)
KV_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}
# bytes per weight of whole-model quant types, for the "smaller quant" advice
QUANT_BYTES_PER_WEIGHT: dict[str, float] = {
    "F32": 4.0,
    "F16": 2.0,
    "BF16": 2.0,
    "Q8_0": 34 / 32,
    "Q6_K": 210 / 256,
    "Q5_K": 176 / 256,
    "Q5_1": 24 / 32,
    "Q5_0": 22 / 32,
    "Q4_K": 144 / 256,
    "Q4_1": 20 / 32,
    "Q4_0": 18 / 32,
    "IQ4_NL": 18 / 32,
}

# ggml types ggml-cpu repacks, per CPU family (repack.cpp, version of notes/engine.md), with the
# row interleave their ne[1] must divide by; ARM measured with an arm64 build (perf/arm_repack.py):
# it also repacks Q8_0 (an output.weight), and decides from the variant's COMPILED features
_ARM = {"Q4_0": 4, "Q4_K": 8, "Q5_K": 8, "Q6_K": 8, "IQ4_NL": 4, "MXFP4": 4, "Q8_0": 4, "Q1_0": 4}
REPACK_TYPES: dict[str, dict[str, int]] = {
    "x86-avx2": {"Q4_0": 8, "Q4_K": 8, "IQ4_NL": 8, "MXFP4": 8},
    "x86-avx512": {"Q4_0": 8, "Q4_K": 8, "IQ4_NL": 8, "MXFP4": 8, "Q2_K": 8},
    "arm-dotprod": dict(_ARM),  # Cortex-A55/A76 (RK3588, Pi 5): asimddp
    "arm-i8mm": dict(_ARM),  # + i8mm: other kernels, the same types and sizes
    "none": {},  # also armv8.0 (Cortex-A53/A72, no asimddp): nothing is copied
}


def cpu_family(machine: str, cpuinfo: str) -> str:
    """Which REPACK_TYPES row applies, from uname machine and /proc/cpuinfo text (pure)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if machine in ("x86_64", "amd64"):
        if "avx512f" in flags and "avx2" in flags:
            return "x86-avx512"
        return "x86-avx2" if "avx2" in flags else "none"
    if machine in ("aarch64", "arm64"):
        if "asimddp" not in flags:
            return "none"
        return "arm-i8mm" if "i8mm" in flags else "arm-dotprod"
    return "none"


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    detail: str


@dataclass(frozen=True)
class Estimate:
    model: str
    settings: Settings
    terms: tuple[Term, ...]
    compute_reserved: int
    budget: int | None = None
    max_ctx: int | None = None  # largest -c that fits the budget (None: no budget / none fits)
    advice: tuple[str, ...] = field(default_factory=tuple)
    quant: str | None = None  # the weights' dominant type (GgufInfo.quant): metrics' engine_info
    # llama-server: the largest --cache-ram (MiB) that fits the budget at this -c (None: no
    # budget, not a server, or none fits)
    max_cache_ram: int | None = None
    # what the estimate does not size (options, a recurrent model's checkpoints): warned about
    warnings: tuple[str, ...] = ()
    # (peak, runs): what earlier governed runs of this model and argv measured
    # (governor/state/peaks.py), shown beside the formula's total and claimed on the board
    measured: tuple[int, int] | None = None

    @property
    def total(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def unbounded(self) -> bool:
        """A term with no limit (llama-server --cache-ram -1): nothing bounds the total."""
        return self.settings.server and self.settings.cache_ram_mib < 0

    @property
    def fits(self) -> bool:
        if self.budget is None:
            return True
        return not self.unbounded and self.total <= self.budget

    def term(self, name: str) -> int:
        return next((t.bytes for t in self.terms if t.name == name), 0)

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "ctx": self.settings.ctx,
            "terms": {t.name: t.bytes for t in self.terms},
            "compute_reserved": self.compute_reserved,
            "total": self.total,
            "budget": self.budget,
            "fits": self.fits,
            "max_ctx": self.max_ctx,
            "advice": list(self.advice),
            "quant": self.quant,
            **(self._server_dict() if self.settings.server else {}),
            "warnings": list(self.warnings),
            **self._measured_dict(),
        }

    def _measured_dict(self) -> dict[str, object]:
        if self.measured is None:
            return {}
        return {"measured": {"peak": self.measured[0], "runs": self.measured[1]}}

    def _server_dict(self) -> dict[str, object]:
        s = self.settings
        return {
            "server": {
                "slots": s.slots,
                "kv_unified": s.kv_unified,
                "slot_ctx": s.slot_cells,
                "cache_ram_mib": s.cache_ram_mib,
                "ctx_checkpoints": s.ctx_checkpoints,
                "largest_cache_ram_mib": self.max_cache_ram,
            }
        }


def kv_token_bytes(info: GgufInfo, s: Settings) -> float:
    """KV bytes of one token over all layers (K and V at -ctk/-ctv)."""
    k = KV_TYPE_BYTES.get(s.cache_type_k, 2.0) * info.n_embd_k
    v = KV_TYPE_BYTES.get(s.cache_type_v, 2.0) * info.n_embd_v
    return info.n_layer * (k + v)


def kv_bytes(info: GgufInfo, s: Settings) -> int:
    return int(s.kv_cells * kv_token_bytes(info, s))


def repack_bytes(info: GgufInfo, family: str) -> int:
    types = REPACK_TYPES.get(family, {})
    return sum(
        t.n_bytes
        for t in info.tensors
        if t.type in types and t.rows % types[t.type] == 0 and t.name != "token_embd.weight"
    )


def compute_reserved(info: GgufInfo, s: Settings) -> int:
    """ggml's compute buffer for one ubatch: f32 logits (vocab) plus the widest activations
    (~2 x n_embd) per token; the ubatch is capped by -b and by n_ctx (llama-context.cpp)."""
    ub = min(s.ubatch, s.batch, s.ctx)
    return ub * (info.vocab + 2 * info.n_embd) * 4


def compute_touched(info: GgufInfo, s: Settings) -> int:
    """The part of :func:`compute_reserved` the estimate counts: COMPUTE_TOUCHED_SHARE of it,
    its logits part (vocab x ubatch f32) counted up to LOGITS_COUNTED_MAX."""
    ub = min(s.ubatch, s.batch, s.ctx)
    logits = ub * info.vocab * 4
    counted = compute_reserved(info, s) - logits + min(logits, LOGITS_COUNTED_MAX)
    return int(counted * COMPUTE_TOUCHED_SHARE)


def estimate(
    info: GgufInfo,
    s: Settings,
    *,
    family: str,
    budget: int | None = None,
    margin: int = MARGIN_BYTES,
    unsized: tuple[str, ...] = (),
) -> Estimate:
    """Every term of the resident-memory estimate; with a budget, the largest -c (and for
    llama-server the largest --cache-ram) that fits and what to change when it does not.
    ``unsized``: the engine options it does not size (EngineArgs.unsized), kept as warnings."""
    terms = _terms(info, s, family, margin)
    warnings = tuple(f"not sized: {u}" for u in unsized)
    if s.server and info.recurrent and s.ctx_checkpoints > 0:
        warnings += (
            f"not sized: the context checkpoints of a recurrent model ({info.architecture}:"
            f" up to {s.ctx_checkpoints} states per slot; --ctx-checkpoints 0 turns them off)",
        )
    if s.projector is not None:
        said = projector.context_warning(s.projector, s.slot_cells)
        warnings += (said,) if said else ()
    est = Estimate(
        model=info.path,
        settings=s,
        terms=terms,
        compute_reserved=compute_reserved(info, s),
        quant=info.quant,
        warnings=warnings,
    )
    if budget is None:
        return est
    est = replace(
        est,
        budget=budget,
        max_ctx=largest_ctx(info, s, family=family, budget=budget, margin=margin),
        max_cache_ram=largest_cache_ram(info, s, family=family, budget=budget, margin=margin),
    )
    if est.fits:
        return est
    return replace(
        est, advice=tuple(_advice(info, s, est, family=family, budget=budget, margin=margin))
    )


def _terms(info: GgufInfo, s: Settings, family: str, margin: int) -> tuple[Term, ...]:
    weights = info.tensor_bytes
    how = "file pages (mmap)" if s.mmap else "anonymous copy (-lm none)"
    types = ", ".join(f"{k} {v / MIB:.0f} MiB" for k, v in sorted(info.types().items()))
    out = [Term("weights", weights, f"{how}: {types}")]
    if s.repack and s.mmap:
        rep = repack_bytes(info, family)
        out.append(Term("repack", rep, f"CPU_REPACK copy of repackable weights ({family}); -nr"))
    slots = ""
    if s.server:
        shared = "one unified buffer" if s.kv_unified or s.slots == 1 else "split per slot"
        slots = f", -np {s.slots}: {shared}, {s.slot_cells} cells a slot"
    out.append(
        Term(
            "kv_cache",
            kv_bytes(info, s),
            f"2 x {info.n_layer} layers x {s.kv_cells} cells x n_embd_kv {info.n_embd_k}"
            f" ({s.cache_type_k}/{s.cache_type_v}){slots}",
        )
    )
    reserved = compute_reserved(info, s)
    ub = min(s.ubatch, s.batch, s.ctx)
    capped = ub * info.vocab * 4 > LOGITS_COUNTED_MAX
    out.append(
        Term(
            "compute",
            compute_touched(info, s),
            f"{COMPUTE_TOUCHED_SHARE:.0%} of {reserved / MIB:.0f} MiB reserved"
            f" (vocab {info.vocab} x ubatch {ub} logits"
            + (f", counted up to {LOGITS_COUNTED_MAX // MIB} MiB)" if capped else ")"),
        )
    )
    if s.projector is not None:
        out += [Term(*t) for t in projector.terms(s.projector)]
    if s.server:
        tok = kv_token_bytes(info, s)
        out += [Term(*t) for t in server.terms(info, s, tok)]
        margin += server.MARGIN_BYTES
    if s.engine_files is None:
        out.append(
            Term("engine", ENGINE_FILE_BYTES, "binary and libs: not found, the largest measured")
        )
    else:
        out.append(Term("engine", s.engine_files, "binary and libs beside it: file pages"))
    out.append(Term("margin", margin, "heap, arenas, threads, page tables (measured)"))
    return tuple(out)


def total_for(info: GgufInfo, s: Settings, *, family: str, margin: int = MARGIN_BYTES) -> int:
    return sum(t.bytes for t in _terms(info, s, family, margin))


def largest_ctx(
    info: GgufInfo, s: Settings, *, family: str, budget: int, margin: int = MARGIN_BYTES
) -> int | None:
    """The largest -c (a multiple of 256, up to n_ctx_train) whose total fits ``budget``
    (None when none does, or when an unlimited prompt cache leaves no bound)."""
    if s.server and s.cache_ram_mib < 0:
        return None
    lo, hi = 0, max(1, info.n_ctx_train // KV_CELL_PAD)
    while lo < hi:  # total is monotone in ctx
        mid = (lo + hi + 1) // 2
        if (
            total_for(info, replace(s, ctx=mid * KV_CELL_PAD), family=family, margin=margin)
            <= budget
        ):
            lo = mid
        else:
            hi = mid - 1
    return lo * KV_CELL_PAD if lo else None


def largest_cache_ram(
    info: GgufInfo, s: Settings, *, family: str, budget: int, margin: int = MARGIN_BYTES
) -> int | None:
    """llama-server: the largest --cache-ram in MiB that fits ``budget`` beside the other terms
    at this -c (None: not a server, or not even --cache-ram 0 fits)."""
    if not s.server:
        return None
    rest = total_for(info, replace(s, cache_ram_mib=0), family=family, margin=margin)
    return (budget - rest) // MIB if rest <= budget else None


def _advice(
    info: GgufInfo, s: Settings, est: Estimate, *, family: str, budget: int, margin: int
) -> Iterable[str]:
    over = est.total - budget
    if s.server and s.cache_ram_mib < 0:
        yield (
            f"--cache-ram {est.max_cache_ram} (the prompt cache has no limit with -1:"
            " largest that fits)"
            if est.max_cache_ram
            else "--cache-ram 0 (the prompt cache has no limit with -1)"
        )
    elif s.server and est.term("prompt_cache") and est.max_cache_ram is not None:
        yield f"--cache-ram {est.max_cache_ram} (largest prompt cache that fits at -c {s.ctx})"
    if est.max_ctx is not None and est.max_ctx < s.ctx:
        yield f"-c {est.max_ctx} (largest context that fits)"
    if s.server and not s.kv_unified and s.slots > 1 and s.kv_cells > s.ctx:
        yield f"--kv-unified ({s.slots} slots share -c {s.ctx} instead of padding each)"
    rep = est.term("repack")
    if rep:
        fits = total_for(info, replace(s, repack=False), family=family, margin=margin) <= budget
        yield f"-nr (no weight repack: -{rep / MIB:.0f} MiB{'' if fits else ', not enough alone'})"
    if s.cache_type_k == "f16" and s.cache_type_v == "f16":
        q8 = replace(s, cache_type_k="q8_0", cache_type_v="q8_0")
        saved = est.term("kv_cache") - kv_bytes(info, q8)
        yield f"-ctk q8_0 -ctv q8_0 (KV cache -{saved / MIB:.0f} MiB)"
    smaller = smaller_quant(info)
    if smaller is not None:
        name, size = smaller
        yield f"a smaller quant ({name}: weights ~{size / MIB:.0f} MiB)"
    if over > 0:
        yield f"or raise memory.max by {math.ceil(over / MIB)} MiB"


def smaller_quant(info: GgufInfo) -> tuple[str, int] | None:
    """The next smaller common quant of this model's 2-D weights (None at Q4 or below)."""
    current = QUANT_BYTES_PER_WEIGHT.get(info.quant)
    if current is None:
        return None
    for name in ("Q8_0", "Q4_K", "Q4_0"):
        bpw = QUANT_BYTES_PER_WEIGHT[name]
        if bpw < current * 0.9:
            size = sum(int(t.n_elements * bpw) if t.rows > 1 else t.n_bytes for t in info.tensors)
            return name, size
    return None


def render(est: Estimate) -> str:
    """The human-readable table `governor estimate` prints."""

    def mib(n: int) -> str:
        return f"{n / MIB:9.1f} MiB"

    s = est.settings
    lines = [
        f"model {est.model}: -c {s.ctx}, -ub {min(s.ubatch, s.batch, s.ctx)},"
        f" load {s.load_mode}, repack {'on' if s.repack else 'off'}"
        + (
            f"; llama-server -np {s.slots}, --cache-ram {s.cache_ram_mib},"
            f" --ctx-checkpoints {s.ctx_checkpoints}"
            if s.server
            else ""
        )
    ]
    w = max(10, 1 + max(len(t.name) for t in est.terms))  # prompt_cache is 12 long
    lines += [f"  {t.name:<{w}}{mib(t.bytes)}  {t.detail}" for t in est.terms]
    lines.append(f"  {'total':<{w}}{mib(est.total)}")
    lines += measured_lines(est, w)
    if est.budget is not None:
        verdict = (
            "fits"
            if est.fits
            else "does NOT fit: the prompt cache has no limit"
            if est.unbounded
            else f"does NOT fit (over by {mib(est.total - est.budget)})"
        )
        lines.append(f"  {'budget':<{w}}{mib(est.budget)}  memory.max: {verdict.strip()}")
        lines.append(
            f"  largest -c that fits: {est.max_ctx}"
            if est.max_ctx is not None
            else "  no context fits this budget"
        )
        if s.server:
            lines.append(
                f"  largest --cache-ram that fits at -c {s.ctx}: {est.max_cache_ram} MiB"
                if est.max_cache_ram is not None
                else f"  no --cache-ram fits at -c {s.ctx}"
            )
    lines += [f"  warning: {warning}" for warning in est.warnings]
    for a in est.advice:
        lines.append(f"  fix: {a}")
    return "\n".join(lines) + "\n"


def measured_lines(est: Estimate, width: int) -> list[str]:
    """The peak earlier runs measured, beside the formula's total: ``peak 612.0 MiB (measured,
    3 runs)`` and how far the formula is from it."""
    if est.measured is None:
        return []
    peak, runs = est.measured
    ratio = est.total / peak
    return [
        f"  {'peak':<{width}}{peak / MIB:9.1f} MiB  (measured, {runs} run{'s' * (runs != 1)};"
        f" the formula's total is {ratio:.2f}x it)"
    ]
