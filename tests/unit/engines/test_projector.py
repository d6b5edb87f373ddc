"""A vision projector (--mmproj) in the estimate (governor/engines/projector.py): its header read
into image tokens and an encode buffer, its terms in `governor estimate`, the options that
change it (--no-mmproj, --image-max-tokens, LLAMA_ARG_MMPROJ). Files: written by
tests/engine/make_mmproj.py and make_gguf.py (the synthetic pair scripts/engine-setup caches).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from governor.engines import projector as pj
from governor.engines.budget import estimate_argv, estimate_router
from governor.engines.estimate import render
from governor.engines.llama import parse_llama_argv
from governor.engines.router import render as render_router
from governor.errors import PolicyError

REPO = Path(__file__).resolve().parents[3]
MIB = 1 << 20
SERVER = "/opt/llama/bin/llama-server"


def _mlp(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "general.architecture": "clip",
        "clip.projector_type": "mlp",
        "clip.vision.image_size": 336,
        "clip.vision.patch_size": 14,
        "clip.vision.embedding_length": 1024,
        "clip.vision.feed_forward_length": 4096,
        "clip.vision.projection_dim": 4096,
    }
    fields.update(changes)
    return fields


def test_a_llava_projector_takes_its_patch_grid_in_tokens() -> None:
    p = pj.projector_from_fields("m.gguf", _mlp(), 600 * MIB)
    assert (p.kind, p.tokens, p.n_pos) == ("mlp", 576, 576)  # (336 / 14)^2, LLaVA-1.5
    # 576 x (4096 + 4 x 1024) x 4 + the 336 px image + 576 x 4096 embeddings, all f32
    assert p.encode == 576 * 8192 * 4 + 3 * 336 * 336 * 4 + 576 * 4096 * 4


def test_a_merging_projector_divides_its_patches_by_the_merge_squared() -> None:
    fields = _mlp(**{"clip.projector_type": "gemma3", "clip.vision.image_size": 896})
    fields["clip.vision.projector.scale_factor"] = 4
    p = pj.projector_from_fields("g.gguf", fields, 1)
    assert (p.n_pos, p.tokens) == (4096, 256)  # Gemma 3: 256 tokens an image


def test_image_max_tokens_caps_a_dynamic_resolution_projector_only() -> None:
    dyn = _mlp(**{"clip.projector_type": "qwen2vl_merger", "clip.vision.image_size": 0})
    dyn |= {"clip.vision.spatial_merge_size": 2, "clip.vision.image_max_pixels": 1280 * 28 * 28}
    assert pj.projector_from_fields("q.gguf", dyn, 1).tokens == 1280
    capped = pj.projector_from_fields("q.gguf", dyn, 1, image_max_tokens=256)
    assert (capped.tokens, capped.n_pos) == (256, 1024)
    fixed = pj.projector_from_fields("m.gguf", _mlp(), 1, image_max_tokens=256)
    assert fixed.tokens == 576  # a fixed-size projector ignores the cap (llama.cpp's help)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"general.architecture": "llama"}, "general.architecture"),
        ({"clip.projector_type": ""}, "clip.projector_type"),
        ({"clip.vision.patch_size": 0}, "clip.vision.patch_size"),
    ],
)
def test_a_file_that_is_no_vision_projector_is_refused_naming_the_key(
    changes: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        pj.projector_from_fields("x.gguf", _mlp(**changes), 1)


def test_mmproj_options_are_read_not_warned_about() -> None:
    args = parse_llama_argv(
        [SERVER, "-m", "t.gguf", "--mmproj", "p.gguf", "--image-max-tokens", "64"]
    )
    assert (args.mmproj, args.image_max_tokens, args.unsized) == ("p.gguf", 64, ())
    assert parse_llama_argv([SERVER, "-m", "t.gguf", "-mm", "p.gguf", "--no-mmproj"]).mmproj is None
    env = parse_llama_argv([SERVER, "-m", "t.gguf"], {"LLAMA_ARG_MMPROJ": "e.gguf"})
    assert env.mmproj == "e.gguf"


# ------------------------------------------------------------------ real files (gguf package)


def _gen(name: str) -> Any:
    pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO / "tests" / "engine"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("mm")
    model, proj = tmp / "tiny.gguf", tmp / "mmproj.gguf"
    assert _gen("make_gguf").main(["--preset", "tiny", "-o", str(model)]) == 0
    small = ["--n-layer", "2", "--n-embd", "128", "--n-ff", "256", "--hidden", "128"]
    small += ["--image-size", "448"]  # 32 x 32 patches: 1024 tokens an image
    assert _gen("make_mmproj").main([*small, "-o", str(proj)]) == 0
    return model, proj


def test_the_synthetic_projector_is_sized_into_the_estimate(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    model, proj = pair
    argv = ["llama-completion", "-m", str(model), "-c", "1024"]
    without = estimate_argv(parse_llama_argv(argv), root=Path("/"), budget=None)
    est = estimate_argv(
        parse_llama_argv([*argv, "--mmproj", str(proj)]), root=Path("/"), budget=None
    )
    p = est.settings.projector
    assert p is not None and (p.kind, p.tokens, p.projection_dim) == ("mlp", 1024, 256)
    assert 0 < proj.stat().st_size - p.weights < 64 << 10  # the file is its tensors + a header
    assert est.term("projector") == 2 * p.weights > 0
    assert est.term("image") == p.encode + pj.IMAGE_MARGIN_BYTES
    assert est.total == without.total + est.term("projector") + est.term("image")
    assert "projector" in render(est) and "1024 context tokens an image" in render(est)
    assert not est.warnings  # -c 1024 holds one image
    # llama-server's image state was not above the CLI's worst (perf/accuracy.py --repeat)
    srv = ["llama-server", *argv[1:], "--cache-ram", "0", "--mmproj", str(proj)]
    served = estimate_argv(parse_llama_argv(srv), root=Path("/"), budget=None)
    assert served.term("image") == est.term("image")


def test_a_context_smaller_than_one_image_is_warned_about(pair: tuple[Path, Path]) -> None:
    model, proj = pair
    argv = ["llama-completion", "-m", str(model), "-c", "512", "--mmproj", str(proj)]
    est = estimate_argv(parse_llama_argv(argv), root=Path("/"), budget=None)
    assert any("one image takes 1024 context tokens" in w for w in est.warnings)


def test_a_text_model_given_as_projector_is_refused_65(pair: tuple[Path, Path]) -> None:
    model, _proj = pair
    argv = ["llama-completion", "-m", str(model), "--mmproj", str(model)]
    with pytest.raises(PolicyError, match="not a vision projector") as err:
        estimate_argv(parse_llama_argv(argv), root=Path("/"), budget=None)
    assert err.value.exit_code == 65


def test_a_router_model_directory_gives_its_child_the_projector_beside_it(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    model, proj = pair
    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "model.gguf").symlink_to(model)
    (tmp_path / "vl" / "vl-mmproj-f16.gguf").symlink_to(proj)  # "mmproj" anywhere in the name
    (tmp_path / "text.gguf").symlink_to(model)
    (tmp_path / "x-mmproj.gguf").symlink_to(proj)  # a top-level projector is no model
    args = parse_llama_argv([SERVER, "--models-dir", str(tmp_path), "-c", "1024"])
    rest = estimate_router(args, root=Path("/"), budget=None, cwd=tmp_path)
    by = {m.alias: e for m, e in rest.models}
    assert sorted(by) == ["text", "vl"]
    assert by["text"].settings.projector is None
    vl = by["vl"].settings.projector
    assert vl is not None and vl.path == str(tmp_path / "vl" / "vl-mmproj-f16.gguf")
    assert by["vl"].total - by["text"].total == by["vl"].term("projector") + by["vl"].term("image")
    table = render_router(rest)
    assert "projector" in table.splitlines()[1]


def test_the_projector_file_keys_the_plan_cache(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A replaced projector must compile again: its header sized the cached estimate."""
    from governor.api.launch_compile import _projector, _router_inputs

    model, proj = pair
    args = parse_llama_argv([SERVER, "-m", str(model), "--mmproj", str(proj)])
    assert _projector(args) == [str(proj)]
    assert _projector(parse_llama_argv([SERVER, "-m", str(model)])) == []
    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "model.gguf").symlink_to(model)
    (tmp_path / "vl" / "mmproj.gguf").symlink_to(proj)
    router = parse_llama_argv([SERVER, "--models-dir", str(tmp_path)])
    assert str(tmp_path / "vl" / "mmproj.gguf") in _router_inputs(router, tmp_path)


# perf/accuracy.py's projector cells in the kernel guest (b11312, docs/benchmarks.md "The
# accuracy band"): the estimate's other terms as the run printed them, bytes (weights, KV,
# compute, projector, engine, margin), the encode buffer, and every memory.peak seen (MiB):
# runs 1 and 2 and the spread run's (`--repeat 3`, cut by its guest timeout after 8 runs)
GUEST_PROJECTOR_CELLS = [
    ("tiny-mtmd-cli-c1024", 119_520_804, [125.8, 135.1, 137.3]),
    ("tiny-mmproj-c1024", 125_720_636, [140.2, 138.0, 138.3, 138.1]),
    ("tiny-mmproj-c2048-np2", 129_914_940, [144.4, 134.0, 143.0]),
]
ENCODE_64PX = 15_544_320 - 10 * MIB  # the synthetic projector's encode (run 2's image term)


@pytest.mark.parametrize(("cell", "others", "peaks"), GUEST_PROJECTOR_CELLS)
def test_the_image_state_holds_every_guest_peak_within_the_band(
    cell: str, others: int, peaks: list[float]
) -> None:
    """Never under the worst run, at most 10 % over it: the limit the cell needs is its worst
    run's peak (a single run moved up to 11.5 MiB)."""
    est = others + ENCODE_64PX + pj.IMAGE_MARGIN_BYTES
    worst = max(peaks) * MIB
    assert worst <= est <= 1.10 * worst, (cell, est / MIB, max(peaks))
