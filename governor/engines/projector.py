"""A vision projector (llama.cpp's ``--mmproj``, tools/mtmd) sized beside its text model (pure,
but for :func:`read_projector`).

The projector is a ViT encoder plus a projection into the text model's embedding space, in a
GGUF of its own (``general.architecture = clip``; keys and shapes: tools/mtmd/clip.cpp,
load_hparams). Its memory, added to the text model's estimate (governor/engines/estimate.py):

- weights: clip.cpp reads the tensors with an ifstream into a backend buffer (not mmap): an
  anonymous copy, plus the file pages that read leaves in the page cache, charged to the
  cgroup on a cold cache (cgroup-v2.rst "Memory Ownership"): counted twice, as the text
  model's repack copy is.
- encode: the ViT's compute buffer over one image's patches, all of it written when an image
  is encoded: per position the widest live activations, the FFN's n_ff and ~4 x n_embd f32
  (ggml-alloc reuses the rest; flash attention, CPU's default, keeps no n_pos^2 score matrix),
  plus the image itself as f32 and the embeddings handed to the text model.
- image tokens: one image is (image_size / patch_size)^2 / merge^2 positions of the text
  model's context (merge: clip.vision.spatial_merge_size or .projector.scale_factor); dynamic-
  resolution projectors (clip.vision.image_max_pixels) take up to that many pixels, capped by
  ``--image-max-tokens``. The KV cache is counted whole at -c already, so an image costs no
  bytes there: it takes context, and a slot too small for one image is warned about.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from governor.engines.gguf import read_header
from governor.errors import PolicyError

MIB = 1 << 20
# mtmd's per-request state beside the encode buffer: the decoded image, the helper's batches
# (measured on llama-server 0c1e57098 with the synthetic projector, a 64x64 PNG: 10.6 MiB of
# anon after the first image on the host), and in llama-server its HTTP and task threads'
# copies (their malloc arenas). Fit on the WORST memory.peak of repeated kernel guest runs
# (perf/accuracy.py --repeat, b11312, docs/benchmarks.md "The accuracy band"): the state
# beyond the other terms was up to 18.5 MiB for llama-mtmd-cli (peaks 125.8-137.3 MiB) and
# 15.5-15.7 MiB for llama-server (its two cells 138.0-140.2 and 134.0-144.4 MiB): one figure
# for both, the server's not above the CLI's; 22 MiB puts the three cells +2.6..+4.7 % over
# their worst run
IMAGE_MARGIN_BYTES = 22 * MIB
F32 = 4
# activations live at once per position besides the FFN's (residual, normed input, attention
# output, one spare): ggml-alloc's peak in a ViT block
LIVE_EMBD = 4


@dataclass(frozen=True)
class Projector:
    """What the estimate needs of one projector file (numbers only)."""

    path: str
    kind: str  # clip.projector_type ("mlp", "qwen2vl_merger", "gemma3", ...)
    weights: int  # tensor bytes
    n_pos: int  # ViT positions of the largest image
    tokens: int  # context positions one image takes
    n_embd: int
    n_ff: int
    image_size: int
    projection_dim: int
    offload: bool = True  # --no-mmproj-offload: False (a CPU-only build runs it on CPU anyway)

    @property
    def encode(self) -> int:
        """Bytes written while one image is encoded (module docstring)."""
        acts = self.n_pos * (self.n_ff + LIVE_EMBD * self.n_embd) * F32
        image = 3 * self.image_size * self.image_size * F32
        return acts + image + self.tokens * self.projection_dim * F32


def _num(fields: dict[str, Any], key: str) -> int:
    v = fields.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def projector_from_fields(
    path: str, fields: dict[str, Any], weights: int, *, image_max_tokens: int | None = None
) -> Projector:
    """The projector a clip GGUF's header describes (pure); ValueError naming the key when it
    is not a vision projector llama.cpp would load."""
    if fields.get("general.architecture") != "clip":
        raise ValueError(f"general.architecture is {fields.get('general.architecture')!r}")
    kind = fields.get("clip.projector_type") or fields.get("clip.vision.projector_type")
    if not isinstance(kind, str) or not kind:
        raise ValueError("key clip.projector_type missing")
    need = {}
    for key in ("image_size", "patch_size", "embedding_length", "projection_dim"):
        need[key] = _num(fields, f"clip.vision.{key}")
        if not need[key] and key != "image_size":
            raise ValueError(f"key clip.vision.{key} missing or not a positive integer")
    patch = need["patch_size"]
    merge = (
        _num(fields, "clip.vision.spatial_merge_size")
        or _num(fields, "clip.vision.projector.scale_factor")
        or 1
    )
    max_pixels = _num(fields, "clip.vision.image_max_pixels")
    side = need["image_size"]
    n_pos = (side // patch) ** 2
    if max_pixels:  # dynamic resolution: the largest image it resizes to
        n_pos = max(n_pos, max_pixels // (patch * patch))
    tokens = max(1, n_pos // (merge * merge))
    if image_max_tokens and max_pixels and image_max_tokens < tokens:
        tokens, n_pos = image_max_tokens, image_max_tokens * merge * merge
    return Projector(
        path=path,
        kind=kind,
        weights=weights,
        n_pos=n_pos,
        tokens=tokens,
        n_embd=need["embedding_length"],
        n_ff=_num(fields, "clip.vision.feed_forward_length") or 4 * need["embedding_length"],
        image_size=side or math.isqrt(n_pos) * patch,
        projection_dim=need["projection_dim"],
    )


def read_projector(path: Path, *, image_max_tokens: int | None = None) -> Projector:
    """Read ``path``'s header (the errors of read_gguf; 65 for a GGUF that is no projector)."""
    _size, fields, _n, tensors, _ft = read_header(path)
    try:
        return projector_from_fields(
            str(path),
            fields,
            sum(t.n_bytes for t in tensors),
            image_max_tokens=image_max_tokens,
        )
    except ValueError as err:
        raise PolicyError(
            f"not a vision projector llama.cpp loads: {err}",
            file=str(path),
            field="--mmproj",
            hint="--mmproj takes the mmproj-*.gguf published beside the model",
        ) from err


def terms(p: Projector) -> list[tuple[str, int, str]]:
    """(name, bytes, detail) of the projector's terms."""
    where = "" if p.offload else "; --no-mmproj-offload"
    state = IMAGE_MARGIN_BYTES
    return [
        (
            "projector",
            2 * p.weights,
            f"{p.kind} {p.weights / MIB:.0f} MiB: anonymous copy + its file pages read once{where}",
        ),
        (
            "image",
            p.encode + state,
            f"encode {p.encode / MIB:.1f} MiB ({p.n_pos} patches) + mtmd"
            f" {state / MIB:.0f} MiB; {p.tokens} context tokens an image",
        ),
    ]


def context_warning(p: Projector, slot_cells: int) -> str | None:
    """A warning when one slot's context cannot hold one image's tokens."""
    if p.tokens <= slot_cells:
        return None
    return (
        f"one image takes {p.tokens} context tokens ({p.kind} projector), more than a slot's"
        f" {slot_cells}: raise -c (or --image-max-tokens for a dynamic-resolution projector)"
    )
