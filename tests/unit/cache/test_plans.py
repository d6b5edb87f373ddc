"""The compiled-plan cache's lookup (governor/cache/plans.py) on tmp cache directories and the
host fixture trees: an entry is used only when every input it recorded still holds, and an
entry that is not a compiled plan of this format is a miss, never a crash.

Needs: tests/fixtures/hosts (probe() reads them), a tmp directory. The end-to-end cache tests
(a real `governor launch`, policy/model edits) are in tests/runtime/test_compiled.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from fakefs.plans import make_plan

from governor.cache import plans as compiled
from governor.plan.host import probe
from governor.record import replace

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
HYBRID = HOSTS / "hybrid-host"
NAME = "0" * 40 + ".json"


def _entry(tmp_path: Path, **changes: Any) -> compiled.Compiled:
    """A valid entry for the hybrid-host tree, with one policy and one model file recorded."""
    policy = tmp_path / "p.toml"
    policy.write_text('name = "p"\n')
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    ident = compiled.file_identity(str(model))
    digest = compiled.sha256_file(str(policy))
    assert ident is not None and digest is not None
    entry = compiled.Compiled(
        plan=make_plan(),
        chain=((str(policy), digest),),
        inputs=(ident,),
        host_key=compiled.host_key(probe(HYBRID)),
    )
    return replace(entry, **changes)


def _lookup(cache: Path) -> compiled.Compiled | None:
    hit = compiled.lookup(NAME, root=HYBRID, cgroup_root=None, directory=cache)
    return None if hit is None else hit[0]


def test_a_stored_entry_is_found_and_equals_what_was_stored(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    assert compiled.store(NAME, entry, directory=tmp_path / "cache")
    found = _lookup(tmp_path / "cache")
    assert found is not None and found.from_cache
    assert found.plan == entry.plan
    assert (found.chain, found.inputs, found.host_key) == (
        entry.chain,
        entry.inputs,
        entry.host_key,
    )


def test_an_edited_policy_in_the_chain_is_a_miss(tmp_path: Path) -> None:
    compiled.store(NAME, _entry(tmp_path), directory=tmp_path / "cache")
    (tmp_path / "p.toml").write_text('name = "p"\n# edited\n')
    assert _lookup(tmp_path / "cache") is None


def test_a_model_file_with_another_mtime_is_a_miss(tmp_path: Path) -> None:
    compiled.store(NAME, _entry(tmp_path), directory=tmp_path / "cache")
    model = tmp_path / "model.bin"
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert _lookup(tmp_path / "cache") is None


def test_a_model_file_replaced_by_another_inode_is_a_miss_even_with_size_and_mtime_kept(
    tmp_path: Path,
) -> None:
    compiled.store(NAME, _entry(tmp_path), directory=tmp_path / "cache")
    model = tmp_path / "model.bin"
    st = model.stat()
    new = tmp_path / "model.new"
    new.write_bytes(b"WEIGHTS")  # same size
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, model)
    assert model.stat().st_ino != st.st_ino
    assert _lookup(tmp_path / "cache") is None


def test_another_host_is_a_miss(tmp_path: Path) -> None:
    entry = _entry(tmp_path, host_key=compiled.host_key(probe(HOSTS / "rk3588")))
    compiled.store(NAME, entry, directory=tmp_path / "cache")
    assert _lookup(tmp_path / "cache") is None


def _stored_json(tmp_path: Path) -> dict[str, Any]:
    entry = _entry(tmp_path)
    d: dict[str, Any] = json.loads(entry.to_json())
    return d


@pytest.mark.parametrize(
    ("what", "make"),
    [
        ("bytes that are not JSON", lambda d: b"\xff\x00garbage"),
        ("a JSON list", lambda d: b"[]"),
        ("another plan format", lambda d: json.dumps({**d, "plan": {**d["plan"], "format": 1}})),
        ("a plan that is a list", lambda d: json.dumps({**d, "plan": []})),
        (
            "a watch rule that is a list",
            lambda d: json.dumps({**d, "plan": {**d["plan"], "watch": [[]]}}),
        ),
        (
            "an entry without host_key",
            lambda d: json.dumps({k: v for k, v in d.items() if k != "host_key"}),
        ),
        (
            "an input with a text inode",
            lambda d: json.dumps({**d, "inputs": [["/x", 1, "ino", 3, 4]]}),
        ),
    ],
)
def test_an_entry_that_is_not_a_compiled_plan_is_a_miss(
    tmp_path: Path, what: str, make: Any
) -> None:
    raw = make(_stored_json(tmp_path))
    cache = tmp_path / "cache"
    assert compiled.store(NAME, _entry(tmp_path), directory=cache)  # a valid one, then replaced
    path = cache / compiled.SUBDIR / NAME
    path.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
    assert _lookup(cache) is None, what
