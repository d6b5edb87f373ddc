"""Write a synthetic vision projector GGUF (LLaVA's "mlp" type) that llama.cpp's mtmd loads.

The projector pairs with a synthetic text model of n_embd ``--projection-dim`` (the tiny preset:
256). Shapes and key names: tools/mtmd/clip.cpp of llama.cpp (load_hparams, load_tensors,
models/llava.cpp): a ViT of ``--n-layer`` blocks over (image_size / patch_size)^2 patches, the
penultimate block's output projected by mm.0 (n_embd -> hidden), GELU, mm.2 (hidden ->
projection_dim). "mlp" is the projector type with the fewest tensors that llama.cpp still
builds its full vision encoder for. One image is (image_size / patch_size)^2 tokens.

A separate generator from make_gguf.py so that scripts/engine-setup keys this file by its own
hash: changing the projector does not rewrite the text models (1.1 GiB for qwen18b).

Usage: make_mmproj.py -o mmproj.gguf [--image-size 224] [--patch-size 14] [--n-embd 512]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from typing import Any

import gguf  # type: ignore[import-untyped,unused-ignore]
import numpy as np

QT = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Projector:
    image_size: int = 224
    patch_size: int = 14
    n_embd: int = 512
    n_ff: int = 2048
    n_head: int = 8
    n_layer: int = 6
    hidden: int = 1024  # mm.0's output width
    projection_dim: int = 256  # the text model's n_embd

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def tensors(p: Projector) -> list[tuple[str, tuple[int, ...], Any]]:
    """(name, numpy shape (ggml's ne reversed), type): f16 matrices, f32 vectors."""
    e, f = p.n_embd, p.n_ff
    out: list[tuple[str, tuple[int, ...], Any]] = [
        ("v.patch_embd.weight", (e, 3, p.patch_size, p.patch_size), QT.F16),
        ("v.patch_embd.bias", (e,), QT.F32),
        ("v.position_embd.weight", (p.n_patches, e), QT.F16),
        ("v.pre_ln.weight", (e,), QT.F32),
        ("v.pre_ln.bias", (e,), QT.F32),
    ]
    for i in range(p.n_layer):
        b = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out += [(b + name + ".weight", (e, e), QT.F16), (b + name + ".bias", (e,), QT.F32)]
        out += [
            (b + "ln1.weight", (e,), QT.F32),
            (b + "ln1.bias", (e,), QT.F32),
            (b + "ln2.weight", (e,), QT.F32),
            (b + "ln2.bias", (e,), QT.F32),
            (b + "ffn_up.weight", (f, e), QT.F16),
            (b + "ffn_up.bias", (f,), QT.F32),
            (b + "ffn_down.weight", (e, f), QT.F16),
            (b + "ffn_down.bias", (e,), QT.F32),
        ]
    out += [
        ("mm.0.weight", (p.hidden, e), QT.F16),
        ("mm.0.bias", (p.hidden,), QT.F32),
        ("mm.2.weight", (p.projection_dim, p.hidden), QT.F16),
        ("mm.2.bias", (p.projection_dim,), QT.F32),
    ]
    return out


def write(path: str, p: Projector, seed: int = 42) -> int:
    """Write the projector; returns the tensor data bytes."""
    if p.image_size % p.patch_size or p.n_embd % p.n_head:
        raise SystemExit("image_size must divide by patch_size, n_embd by n_head")
    w = gguf.GGUFWriter(path, "clip")
    w.add_name(f"governor-synthetic-mmproj-{p.n_layer}x{p.n_embd}")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", p.image_size)
    w.add_uint32("clip.vision.patch_size", p.patch_size)
    w.add_uint32("clip.vision.embedding_length", p.n_embd)
    w.add_uint32("clip.vision.feed_forward_length", p.n_ff)
    w.add_uint32("clip.vision.block_count", p.n_layer)
    w.add_uint32("clip.vision.projection_dim", p.projection_dim)
    w.add_uint32("clip.vision.attention.head_count", p.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16))
    rng = np.random.default_rng(seed)
    total = 0
    for name, shape, qt in tensors(p):
        if len(shape) == 1:
            arr = np.ones(shape, np.float32) if "ln" in name else np.zeros(shape, np.float32)
        else:
            arr = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(
                np.float16 if qt == QT.F16 else np.float32
            )
        total += arr.nbytes
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True)
    for name in ("image-size", "patch-size", "n-embd", "n-ff", "n-head", "n-layer", "hidden",
                 "projection-dim"):  # fmt: skip
        ap.add_argument(f"--{name}", type=int)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args(argv)
    changes = {k: v for k, v in vars(a).items() if v is not None and k not in ("output", "seed")}
    p = replace(Projector(), **changes)
    total = write(a.output, p, seed=a.seed)
    print(f"wrote {a.output}: {p}, tensor data {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
