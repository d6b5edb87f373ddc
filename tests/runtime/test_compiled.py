"""The compiled-plan cache through real `governor launch` runs (governor/cache/plans.py,
governor/api/launch.py compiled_for_launch): the first launch compiles and stores, an identical
one hits, and any input the plan was compiled from (the policy, a policy it extends, the model
file) changing makes it a miss. A cache directory another user could write is neither read nor
written; an entry that is not a compiled plan is ignored and replaced.

Observed through the ``--debug`` JSON log lines on stderr: ``plan_cache.stored`` (a compile
happened and was stored), ``plan_cache.hit``, ``plan_cache.not_stored``,
``plan_cache.unreadable``. Needs what tests/runtime/conftest.py says (root, cgroup2, PSI).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from governor.cache.plans import SUBDIR

from .conftest import Governor, Run

NOBODY = 65534
TRUE = ("/bin/true",)
LLAMA = '[engine]\nkind = "llama.cpp"\n\n[prefetch]\nmode = "none"\n'


def _entry_name(run: Run) -> str:
    (stored,) = [e for e in run.events if e["event"] == "plan_cache.stored"]
    name = stored["entry"]
    assert isinstance(name, str)
    return name


def _compiled_and_stored(run: Run) -> bool:
    return run.code == 0 and run.has("plan_cache.stored") and not run.has("plan_cache.hit")


def _hit(run: Run) -> bool:
    return run.code == 0 and run.has("plan_cache.hit") and not run.has("plan_cache.stored")


def test_the_first_launch_stores_and_an_identical_second_one_hits(governor: Governor) -> None:
    policy = governor.policy()
    first = governor.run(policy, TRUE)
    assert _compiled_and_stored(first), first.stderr
    second = governor.run(policy, TRUE)
    assert _hit(second), second.stderr
    assert [e["entry"] for e in second.events if e["event"] == "plan_cache.hit"] == [
        _entry_name(first)
    ]


def test_an_edited_policy_file_is_a_miss(governor: Governor) -> None:
    policy = governor.policy("[cpu]\nweight = 100\n")
    assert _compiled_and_stored(governor.run(policy, TRUE))
    governor.policy("[cpu]\nweight = 200\n")
    again = governor.run(policy, TRUE)
    assert _compiled_and_stored(again), again.stderr


def test_an_edited_parent_policy_is_a_miss_though_the_child_is_unchanged(
    governor: Governor,
) -> None:
    base = governor.workdir / "base.toml"
    base.write_text('name = "base"\n\n[cpu]\nweight = 100\n')
    child = governor.policy(file="child.toml", extends="base.toml")
    assert _compiled_and_stored(governor.run(child, TRUE))
    assert _hit(governor.run(child, TRUE))
    base.write_text('name = "base"\n\n[cpu]\nweight = 300\n')
    after = governor.run(child, TRUE)
    assert _compiled_and_stored(after), after.stderr
    assert _hit(governor.run(child, TRUE))  # the recompiled entry is the one used next


def _touch(model: Path) -> None:
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _rewrite_same_size_and_mtime(model: Path) -> None:
    """A new file (new inode) in its place, with the old size and mtime: only the inode says."""
    st = model.stat()
    new = model.with_suffix(".new")
    new.write_bytes(model.read_bytes().upper())
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, model)


@pytest.mark.parametrize("change", [_touch, _rewrite_same_size_and_mtime])
def test_a_changed_model_file_is_a_miss(governor: Governor, change: Callable[[Path], None]) -> None:
    model = governor.workdir / "model.bin"
    model.write_bytes(b"not a gguf, any small file")
    policy = governor.policy(LLAMA)
    engine = (*TRUE, "-m", str(model), "-c", "512")
    assert _compiled_and_stored(governor.run(policy, engine))
    assert _hit(governor.run(policy, engine))
    change(model)
    after = governor.run(policy, engine)
    assert _compiled_and_stored(after), after.stderr


def _world_writable(directory: Path) -> None:
    directory.chmod(0o777)


def _owned_by_nobody(directory: Path) -> None:
    os.chown(directory, NOBODY, NOBODY)


@pytest.mark.parametrize("untrust", [_world_writable, _owned_by_nobody])
def test_an_untrusted_cache_directory_is_neither_read_nor_written(
    governor: Governor, tmp_path: Path, untrust: Callable[[Path], None]
) -> None:
    policy = governor.policy()
    name = _entry_name(governor.run(policy, TRUE))
    # the same valid entry, in a cache directory another user could have written it to
    other = tmp_path / "other-cache"
    (other / SUBDIR).mkdir(parents=True, mode=0o700)
    shutil.copy2(governor.cache / SUBDIR / name, other / SUBDIR / name)
    untrust(other / SUBDIR)
    before = sorted(p.name for p in (other / SUBDIR).iterdir())
    run = governor.run(policy, TRUE, cache=other)
    assert run.code == 0, run.stderr
    assert not run.has("plan_cache.hit")
    assert run.has("plan_cache.not_stored")
    assert sorted(p.name for p in (other / SUBDIR).iterdir()) == before


@pytest.mark.parametrize(
    "garbage",
    [b"\x00garbage", b'{"plan": []}', b"[1, 2]"],
    ids=["bytes", "plan-not-an-object", "json-list"],
)
def test_an_entry_that_is_not_a_compiled_plan_is_ignored_and_replaced(
    governor: Governor, garbage: bytes
) -> None:
    policy = governor.policy()
    name = _entry_name(governor.run(policy, TRUE))
    (governor.cache / SUBDIR / name).write_bytes(garbage)
    run = governor.run(policy, TRUE)
    assert _compiled_and_stored(run), run.stderr
    assert "Traceback" not in run.stderr
    assert _hit(governor.run(policy, TRUE))


@pytest.mark.parametrize("changed", ["binary", "library"])
def test_a_new_engine_build_at_the_same_path_is_a_miss(governor: Governor, changed: str) -> None:
    """The estimate counts the engine's binary and the lib*.so* beside it
    (governor/engines/engine_files.py): a rebuilt engine at the same path compiles again."""
    bindir = governor.workdir / "build" / "bin"
    bindir.mkdir(parents=True)
    binary = bindir / "llama-cli"
    shutil.copy2("/bin/true", binary)
    lib = bindir / "libggml-base.so"
    lib.write_bytes(b"\0" * 4096)
    model = governor.workdir / "model.bin"
    model.write_bytes(b"not a gguf, any small file")
    policy = governor.policy(LLAMA)
    engine = (str(binary), "-m", str(model), "-c", "512")
    assert _compiled_and_stored(governor.run(policy, engine))
    assert _hit(governor.run(policy, engine))
    _touch(binary if changed == "binary" else lib)
    after = governor.run(policy, engine)
    assert _compiled_and_stored(after), after.stderr
    assert _hit(governor.run(policy, engine))
