"""Shared test configuration: requirement markers and real-cgroup fixtures.

Requirement markers (checked before each test's fixtures run; see tests/vm/requirements.py):

    @pytest.mark.kernel(controllers=("memory", "cpu", "cpuset", "io", "pids"), root=True, psi=True)
    @pytest.mark.systemd(min_version=252)
    @pytest.mark.engine(binary="/path/to/llama-cli")

A missing requirement skips the test, or fails it when CI=true.

Fixtures for the kernel and systemd tiers (they run in the qemu guests, see scripts/test):

    cgroup2_root          Path of the cgroup2 mount (from /proc/self/mountinfo)
    scratch_slice         ScratchSlice: a unique `gtest-<hex>.slice` name under the root, killed
                          and removed at teardown (the test fails if that is impossible)
    empty_root_subtree    root cgroup.subtree_control cleared: code under test must enable
                          the controllers it needs itself (restored afterwards)
    enabled_root_subtree  root cgroup.subtree_control enables every available controller
    spawn                 spawn(argv, cgroup=None) -> Popen; the child enters `cgroup` before
                          exec; every spawned process is killed at teardown
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice, Spawn
from vm import requirements


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The GGUF header cache of every test (and of every governor it starts) lives in a tmp
    directory, never in the machine's /var/cache/governor."""
    before = os.environ.get("GOVERNOR_CACHE_DIR")
    os.environ["GOVERNOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("governor-cache"))
    yield
    if before is None:
        os.environ.pop("GOVERNOR_CACHE_DIR", None)
    else:
        os.environ["GOVERNOR_CACHE_DIR"] = before


@pytest.fixture(autouse=True)
def _private_run_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Runtime state (/run/governor) of every test and every governor it starts lives in a tmp
    directory; not in the systemd tier, whose services publish under the real /run/governor."""
    if request.node.get_closest_marker("systemd") is not None or "GOVERNOR_RUN_DIR" in os.environ:
        yield
        return
    os.environ["GOVERNOR_RUN_DIR"] = str(tmp_path_factory.mktemp("governor-run"))
    try:
        yield
    finally:
        os.environ.pop("GOVERNOR_RUN_DIR", None)


@pytest.fixture(autouse=True)
def _private_state_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """What runs measured (the state directory's per-model store, /var/lib/governor as root) of
    every test and every governor it starts lives in a tmp directory, one per test as the run
    dir; not in the systemd tier, whose services keep theirs in the real one."""
    if request.node.get_closest_marker("systemd") is not None or "GOVERNOR_STATE_DIR" in os.environ:
        yield
        return
    os.environ["GOVERNOR_STATE_DIR"] = str(tmp_path_factory.mktemp("governor-state"))
    try:
        yield
    finally:
        os.environ.pop("GOVERNOR_STATE_DIR", None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Check the kernel/systemd/engine requirement markers (skip, or fail when CI=true)."""
    requirements.enforce(requirements.item_reasons(item))


@pytest.fixture(scope="session")
def cgroup2_root() -> Path:
    path, why = requirements.find_cgroup2_root(())
    if path is None:
        requirements.enforce([why])
        raise AssertionError(why)  # not reached: enforce skips or fails
    return path


@pytest.fixture
def scratch_slice(cgroup2_root: Path) -> Iterator[ScratchSlice]:
    s = ScratchSlice(cgroup2_root, f"gtest-{uuid.uuid4().hex[:12]}.slice")
    yield s
    problems = cgroups.kill_and_remove(s.path)
    if problems:
        pytest.fail(f"scratch cgroup {s.path} cleanup failed: " + "; ".join(problems))


def _root_state(root: Path) -> tuple[list[str], list[str]]:
    available = cgroups.read(root / "cgroup.controllers").split()
    enabled = cgroups.read(root / "cgroup.subtree_control").split()
    return available, enabled


def _restore(root: Path, enabled_before: Sequence[str]) -> None:
    with contextlib.suppress(OSError):
        _, now = _root_state(root)
        cgroups.set_subtree_control(root, [c for c in enabled_before if c not in now], True)
        cgroups.set_subtree_control(root, [c for c in now if c not in enabled_before], False)


@pytest.fixture
def empty_root_subtree(cgroup2_root: Path) -> Iterator[Path]:
    """The root's cgroup.subtree_control is empty for the test (restored afterwards)."""
    _, before = _root_state(cgroup2_root)
    failures = cgroups.set_subtree_control(cgroup2_root, list(reversed(before)), False)
    if failures:
        _restore(cgroup2_root, before)
        children = [p.name for p in cgroup2_root.iterdir() if p.is_dir()]
        pytest.fail(f"cannot clear root subtree_control ({'; '.join(failures)}); "
                    f"child cgroups: {children}")  # fmt: skip
    yield cgroup2_root
    _restore(cgroup2_root, before)


@pytest.fixture
def enabled_root_subtree(cgroup2_root: Path) -> Iterator[Path]:
    """Every controller in the root's cgroup.controllers is enabled for its children."""
    available, before = _root_state(cgroup2_root)
    failures = cgroups.set_subtree_control(cgroup2_root, available, True)
    if failures:
        pytest.fail(f"cannot enable root controllers: {'; '.join(failures)}")
    yield cgroup2_root
    _restore(cgroup2_root, before)


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """spawn(argv, cgroup=None, **popen_kwargs): start a process (inside `cgroup` from its
    first instruction when given); stdout+stderr are piped as text unless overridden."""
    started: list[subprocess.Popen[str]] = []

    def _spawn(argv: Sequence[str], cgroup: Path | None = None, **kw: Any) -> subprocess.Popen[str]:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.STDOUT)
        kw.setdefault("stdin", subprocess.DEVNULL)
        if cgroup is None:
            kw.setdefault("text", True)
            p: subprocess.Popen[str] = subprocess.Popen(list(argv), **kw)
        else:
            p = cgroups.start_in_cgroup(cgroup, argv, **kw)
        started.append(p)
        return p

    yield _spawn
    for p in started:
        if p.poll() is None:
            p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.communicate(timeout=30)
