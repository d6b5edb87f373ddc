"""Requirement declarations for the kernel, systemd and engine test tiers.

Tests declare what they need with markers::

    @pytest.mark.kernel(controllers=("memory", "cpu"), root=True, psi=True)
    @pytest.mark.systemd(min_version=252)
    @pytest.mark.engine(binary="/opt/llama.cpp/bin/llama-cli")

A bare ``@pytest.mark.kernel`` asks for all of DEFAULT_CONTROLLERS, root and PSI; a bare
``@pytest.mark.systemd`` for systemd >= DEFAULT_SYSTEMD_VERSION as PID 1.

``pytest_runtest_setup`` (re-exported by tests/conftest.py, or loaded with
``-p vm.requirements``) checks them before the test's fixtures run. A missing requirement
skips the test with the reason, except when the environment variable CI is true: then the
test FAILS, so a CI run cannot go green by silently skipping its real-kernel tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vm.skips import is_ci

DEFAULT_CONTROLLERS: tuple[str, ...] = ("memory", "cpu", "cpuset", "io", "pids")
DEFAULT_SYSTEMD_VERSION = 252
PSI_RESOURCES: tuple[str, ...] = ("cpu", "memory", "io")


def systemctl_version_output() -> str | None:
    exe = shutil.which("systemctl")
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


@dataclass(frozen=True)
class Probe:
    """Where the checks look; tests point it at a fake tree."""

    proc: Path = Path("/proc")
    fs_root: Path = Path("/")
    geteuid: Callable[[], int] = os.geteuid
    systemctl: Callable[[], str | None] = field(default=systemctl_version_output)


# ----------------------------------------------------------------------- mountinfo / cgroup2


def _unescape_mountinfo(field_: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def cgroup2_mounts(mountinfo: str) -> list[Path]:
    """Mount points of all cgroup2 file systems listed in a mountinfo text."""
    out: list[Path] = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fstype = right.split(" ", 1)[0]
        parts = left.split(" ")
        if fstype == "cgroup2" and len(parts) >= 5:
            out.append(Path(_unescape_mountinfo(parts[4])))
    return out


def _under(root: Path, mountpoint: Path) -> Path:
    return root / mountpoint.relative_to("/") if mountpoint.is_absolute() else root / mountpoint


def read_controllers(cgroup_dir: Path) -> set[str]:
    try:
        return set((cgroup_dir / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def find_cgroup2_root(
    controllers: Iterable[str] = (), probe: Probe | None = None
) -> tuple[Path | None, str]:
    """The first cgroup2 mount offering all `controllers` (as seen under probe.fs_root).

    Returns (path, "") or (None, reason).
    """
    p = probe or Probe()
    wanted = list(controllers)
    try:
        mountinfo = (p.proc / "self" / "mountinfo").read_text()
    except OSError as exc:
        return None, f"cannot read mountinfo: {exc}"
    mounts = cgroup2_mounts(mountinfo)
    if not mounts:
        return None, "no cgroup2 file system is mounted"
    best_missing: list[str] = []
    best_mount = mounts[0]
    for mp in mounts:
        path = _under(p.fs_root, mp)
        have = read_controllers(path)
        missing = [c for c in wanted if c not in have]
        if not missing:
            return path, ""
        if len(best_missing) == 0 or len(missing) < len(best_missing):
            best_missing, best_mount = missing, mp
    return None, (
        f"cgroup2 at {best_mount} lacks controller(s) {' '.join(best_missing)} "
        "(hybrid hierarchy? run the kernel tier in the guest: scripts/test --tier kernel)"
    )


# ----------------------------------------------------------------------- checks per marker


def kernel_reasons(
    controllers: Iterable[str] = DEFAULT_CONTROLLERS,
    root: bool = True,
    psi: bool = True,
    probe: Probe | None = None,
) -> list[str]:
    p = probe or Probe()
    reasons: list[str] = []
    path, why = find_cgroup2_root(controllers, p)
    if path is None:
        reasons.append(why)
    if root and p.geteuid() != 0:
        reasons.append("needs root (euid 0)")
    if psi:
        for res in PSI_RESOURCES:
            f = p.proc / "pressure" / res
            try:
                f.read_text()
            except OSError as exc:
                reasons.append(f"PSI not available ({f}: {exc.strerror or exc}); boot with psi=1")
                break
    return reasons


def parse_systemd_version(text: str) -> int | None:
    m = re.match(r"\s*systemd\s+(\d+)", text)
    return int(m.group(1)) if m else None


def systemd_reasons(
    min_version: int = DEFAULT_SYSTEMD_VERSION, probe: Probe | None = None
) -> list[str]:
    p = probe or Probe()
    try:
        comm = (p.proc / "1" / "comm").read_text().strip()
    except OSError as exc:
        return [f"cannot read /proc/1/comm: {exc}"]
    if comm != "systemd":
        return [f"PID 1 is {comm!r}, not systemd (run: scripts/test --tier systemd)"]
    out = p.systemctl()
    if out is None:
        return ["`systemctl --version` failed"]
    version = parse_systemd_version(out)
    if version is None:
        return [f"cannot parse `systemctl --version`: {out.splitlines()[:1]}"]
    if version < min_version:
        return [f"systemd {version} < required {min_version}"]
    return []


def engine_reasons(
    binary: str | os.PathLike[str] | None = None,
    paths: Iterable[str | os.PathLike[str]] = (),
    env: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """Minimal engine checks: the binary (a path, or a name on PATH, or the path in the
    environment variable `env`) and any extra `paths` (models) exist."""
    environ_ = os.environ if environ is None else environ
    reasons: list[str] = []
    target: str | None = None
    if env is not None:
        target = environ_.get(env)
        if not target:
            reasons.append(f"environment variable {env} (engine binary) is not set")
    if target is None and binary is not None:
        target = os.fspath(binary)
    if target is not None:
        found = Path(target).exists() if os.sep in target else shutil.which(target) is not None
        if not found:
            reasons.append(f"engine binary {target} not found")
    reasons.extend(f"{os.fspath(x)} does not exist" for x in paths if not Path(x).exists())
    return reasons


# ----------------------------------------------------------------------- pytest glue


def item_reasons(item: pytest.Item, probe: Probe | None = None) -> list[str]:
    reasons: list[str] = []
    for mark in item.iter_markers(name="kernel"):
        reasons += kernel_reasons(*mark.args, **{**mark.kwargs, "probe": probe})
    for mark in item.iter_markers(name="systemd"):
        reasons += systemd_reasons(*mark.args, **{**mark.kwargs, "probe": probe})
    for mark in item.iter_markers(name="engine"):
        reasons += engine_reasons(*mark.args, **mark.kwargs)
    return list(dict.fromkeys(reasons))


def enforce(reasons: list[str], environ: Mapping[str, str] | None = None) -> None:
    """Skip (developer machine) or fail (CI=true) when any requirement is missing."""
    if not reasons:
        return
    msg = "missing requirement: " + "; ".join(reasons)
    if is_ci(environ):
        pytest.fail(msg + " [CI=true turns this skip into a failure]", pytrace=False)
    pytest.skip(msg)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    enforce(item_reasons(item))
