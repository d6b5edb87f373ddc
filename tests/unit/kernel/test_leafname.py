"""A router model's name as its leaf's name (governor/kernel/leafname.py, issue 43 item 10):
names from a peer are mapped, never trusted; the mapping is one-to-one and reads back."""

from __future__ import annotations

import pytest

from governor.kernel.leafname import (
    NAME_MAX,
    LeafNameError,
    leaf_name,
    model_cgroup,
    model_name,
)


@pytest.mark.parametrize(
    ("model", "leaf"),
    [
        ("tiny", "tiny"),
        ("qwen2.5-0.5b-instruct", "qwen2.5-0.5b-instruct"),  # a dot alone is no kernel prefix
        ("ggml-org/MY-MODEL-GGUF:Q8_0", "ggml-org%2FMY-MODEL-GGUF:Q8_0"),  # llama.cpp's preset
        ("user/repo:quant", "user%2Frepo:quant"),  # a Hugging Face cache's name
        ("../up", "..%2Fup"),
        ("memory.max", "_memory.max"),  # an interface file beside the leaves: EEXIST
        ("cgroup.freeze", "_cgroup.freeze"),
        ("io.max", "_io.max"),  # a file `+io` would create later
        ("irq.pressure", "_irq.pressure"),
        ("_memory.max", "%5Fmemory.max"),  # a name's own _ stays apart from the prefix
        ("100%", "100%25"),
        ("memory", "memory"),  # no dot: no interface file is called so
        ("modèle", "modèle"),
    ],
)
def test_a_model_maps_to_a_safe_leaf_that_reads_back(model: str, leaf: str) -> None:
    assert leaf_name(model) == leaf
    assert model_name(leaf) == model
    assert model_cgroup("governor.slice/r", model) == f"governor.slice/r/models/{leaf}"


@pytest.mark.parametrize(
    "model", ["a\nb", "tab\there", "nul\0", "del\x7f", "c1\x85", "", ".", ".."]
)
def test_control_characters_and_dot_names_name_no_leaf(model: str) -> None:
    with pytest.raises(LeafNameError):
        leaf_name(model)


def test_a_long_name_is_cut_to_name_max_with_a_stable_hash_and_no_half_character() -> None:
    a, b = "é" * 200 + "a", "é" * 200 + "b"
    la, lb = leaf_name(a), leaf_name(b)
    assert len(la.encode()) <= NAME_MAX and len(lb.encode()) <= NAME_MAX
    assert la != lb and la == leaf_name(a)  # apart, and the same every time
    assert la.rsplit("~", 1)[0].strip("é") == ""  # cut between characters
    assert model_name(la) != a  # a cut leaf's model is the publisher's to say (RunState.router)
    slashes = leaf_name("a/" * 100)
    assert len(slashes.encode()) <= NAME_MAX
    assert "%" not in slashes.rsplit("~", 1)[0][-2:]  # never half an escape
    assert leaf_name("x" * NAME_MAX) == "x" * NAME_MAX  # exactly NAME_MAX: kept


@pytest.mark.parametrize("leaf", ["a%2", "%41", "x%5Fy", "_tiny", "a\nb"])
def test_a_leaf_no_model_maps_to_reads_back_as_none(leaf: str) -> None:
    assert model_name(leaf) is None


def test_the_mapping_is_one_to_one_on_names_that_look_alike() -> None:
    names = ["a/b", "a%2Fb", "a%252Fb", "memory.max", "_memory.max", "%5Fmemory.max", "a_b"]
    leaves = [leaf_name(n) for n in names]
    assert len(set(leaves)) == len(names)
    assert all("/" not in leaf for leaf in leaves)
