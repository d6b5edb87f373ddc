"""Write a synthetic llama-architecture GGUF that llama.cpp loads and runs (garbage text).

Only the `gguf` package (and numpy, which it pulls in) is needed. Weights are seeded normal
noise, quantised with ``gguf.quants`` and streamed one tensor at a time, so writing the 1.1 GiB
model needs a few hundred MB of RAM. The output is byte-for-byte deterministic for a seed.

Presets (scripts/engine-setup writes both into the engine cache):
  tiny     4 layers x 256, 4 heads, ffn 768, vocab 4096, q8_0            ~6 MB
  qwen18b  Qwen1.5-1.8B shapes: 24 x 2048, 16 heads, ffn 5504,
           vocab 151936, n_ctx_train 32768; q4_0, output.weight q8_0    ~1.19 GB

Usage: make_gguf.py --preset tiny -o tiny.gguf [--quant q4_0] [--n-head-kv 2] [--seed 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import gguf  # type: ignore[import-untyped,unused-ignore]
import numpy as np

QT = gguf.GGMLQuantizationType
# 2-D weight types gguf.quants can write (K-quants raise NotImplementedError in gguf-py 0.19)
TYPES: dict[str, Any] = {
    "f32": QT.F32,
    "f16": QT.F16,
    "q8_0": QT.Q8_0,
    "q4_0": QT.Q4_0,
    "q4_1": QT.Q4_1,
    "q5_0": QT.Q5_0,
    "q5_1": QT.Q5_1,
}
FILE_TYPES: dict[str, Any] = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
}
N_SPECIAL = 3  # <unk> <s> </s>
N_BYTE = 256  # SPM byte fallback: llama.cpp looks up <0x0A> for "\n", so all 256 must exist


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int
    vocab: int
    quant: str
    output_quant: str | None = None

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


PRESETS = {
    "tiny": Shape(4, 256, 4, 4, 768, 2048, 4096, "q8_0"),
    "qwen18b": Shape(24, 2048, 16, 16, 5504, 32768, 151936, "q4_0", "q8_0"),
}


def vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """SPM vocab: specials, byte tokens, then word pieces ("▁a", "▁ab", ..., "▁t<i>")."""
    if n <= N_SPECIAL + N_BYTE:
        raise SystemExit(f"vocab must be larger than {N_SPECIAL + N_BYTE}")
    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(N_BYTE)]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL] + [tt.BYTE] * N_BYTE
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = ["\u2581", *letters, *("\u2581" + a for a in letters)]
    pieces += ["\u2581" + a + b for a in letters for b in letters]
    i = 0
    while len(tokens) < n:
        tokens.append(pieces[i] if i < len(pieces) else f"\u2581t{i}")
        types.append(tt.NORMAL)
        i += 1
    scores = [0.0] * (N_SPECIAL + N_BYTE) + [
        -float(k) for k in range(1, n - N_SPECIAL - N_BYTE + 1)
    ]
    return tokens, scores, [int(t) for t in types]


def tensors(s: Shape) -> list[tuple[str, tuple[int, ...], Any]]:
    """(name, logical shape (rows, cols), type) in llama.cpp's naming (src/llama-arch.cpp)."""
    w = TYPES[s.quant]
    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    out: list[tuple[str, tuple[int, ...], Any]] = [("token_embd.weight", (s.vocab, s.n_embd), w)]
    for i in range(s.n_layer):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (s.n_embd,), QT.F32),
            (b + "attn_q.weight", (q, s.n_embd), w),
            (b + "attn_k.weight", (kv, s.n_embd), w),
            (b + "attn_v.weight", (kv, s.n_embd), w),
            (b + "attn_output.weight", (s.n_embd, q), w),
            (b + "ffn_norm.weight", (s.n_embd,), QT.F32),
            (b + "ffn_gate.weight", (s.n_ff, s.n_embd), w),
            (b + "ffn_up.weight", (s.n_ff, s.n_embd), w),
            (b + "ffn_down.weight", (s.n_embd, s.n_ff), w),
        ]
    out += [
        ("output_norm.weight", (s.n_embd,), QT.F32),
        ("output.weight", (s.vocab, s.n_embd), TYPES[s.output_quant or s.quant]),
    ]
    return out


def stored(shape: tuple[int, ...], qt: Any) -> tuple[tuple[int, ...], Any]:
    """The array shape and dtype a tensor is stored as (quantised rows are raw bytes)."""
    if qt == QT.F32:
        return shape, np.float32
    if qt == QT.F16:
        return shape, np.float16
    return tuple(gguf.quant_shape_to_byte_shape(shape, qt)), np.uint8


def data(rng: np.random.Generator, shape: tuple[int, ...], qt: Any) -> Any:
    """One tensor's bytes, generated in row blocks of ~4 M values (bounded temporary memory)."""
    if len(shape) == 1:  # RMS norm weights
        return np.ones(shape, dtype=np.float32)
    bshape, dtype = stored(shape, qt)
    out = np.empty(bshape, dtype=dtype)
    rows, cols = shape
    step = max(1, (1 << 22) // cols)
    for r in range(0, rows, step):
        x = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32) * np.float32(0.02)
        if qt == QT.F32:
            out[r : r + len(x)] = x
        elif qt == QT.F16:
            out[r : r + len(x)] = x.astype(np.float16)
        else:
            out[r : r + len(x)] = gguf.quants.quantize(x, qt)
    return out


def write(path: str, s: Shape, seed: int = 42) -> int:
    """Write the model; returns the tensor data bytes."""
    if s.n_embd % s.n_head or s.n_head % s.n_head_kv:
        raise SystemExit("n_embd must be a multiple of n_head, n_head of n_head_kv")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"governor-synthetic-{s.n_layer}x{s.n_embd}-{s.quant}")
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(s.vocab)
    w.add_file_type(FILE_TYPES[s.quant])
    toks, scores, types = vocab(s.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    plan = [(n, sh, QT.F32 if len(sh) == 1 else qt) for n, sh, qt in tensors(s)]
    total = 0
    for name, shape, qt in plan:  # header first, then stream the data tensor by tensor
        bshape, dtype = stored(shape, qt)
        nbytes = int(np.prod(bshape)) * np.dtype(dtype).itemsize
        total += nbytes
        raw = None if qt in (QT.F32, QT.F16) else qt
        w.add_tensor_info(name, bshape, np.dtype(dtype), nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _name, shape, qt in plan:
        w.write_tensor_data(data(rng, shape, qt))
    w.close()
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--quant", choices=sorted(TYPES))
    ap.add_argument("--output-quant", choices=sorted(TYPES))
    for name in ("n-layer", "n-embd", "n-head", "n-head-kv", "n-ff", "n-ctx-train", "vocab"):
        ap.add_argument(f"--{name}", type=int)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args(argv)
    changes = {
        k: v for k, v in vars(a).items() if v is not None and k not in ("output", "preset", "seed")
    }
    shape = replace(PRESETS[a.preset], **changes)
    t0 = time.monotonic()
    total = write(a.output, shape, seed=a.seed)
    print(
        f"wrote {a.output}: {shape}, tensor data {total / 2**20:.1f} MiB,"
        f" {time.monotonic() - t0:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
