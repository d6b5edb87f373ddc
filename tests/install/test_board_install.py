"""The board install on a fresh Debian 12, as a user does it: the wheel built with `python -m
build` (sdist, then the wheel from it), its dependencies from a local wheelhouse made with `pip
download` (the root file system has no network), board-install.sh in a chroot of a minimal
bookworm (mmdebstrap, cached), then in an interactive login shell there: `governor --help`,
`man governor`, `man governor.toml`, a TAB through bash-completion's own loader, and `governor
install` writing units whose ExecStart= is the venv's governor.

Needs root, chroot and mmdebstrap (or the cached root file system): missing, the test skips,
or fails under CI=true. The root file system is cached in GOVERNOR_ROOTFS_CACHE (default
/var/lib/governor/rootfs; ~240 MB, ~2 min to make once, with network); each run unpacks a fresh
copy (~20 s), so nothing of a previous run is seen.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vm.skips import is_ci

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SUITE = "bookworm"
# what a board has beside the minimal base: python3-venv for the install, man and bash-completion
INCLUDE = ("python3-venv", "man-db", "bash-completion")
MMDEBSTRAP = ("--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE)
ENV = {"HOME": "/root", "TERM": "dumb", "LANG": "C.UTF-8", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (chroot)"
    for tool in ("chroot", "tar"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if importlib.util.find_spec("build") is None:
        return "needs the python package build (the dev extra: scripts/setup --tests)"
    if not _rootfs_tar().exists() and shutil.which("mmdebstrap") is None:
        return "needs mmdebstrap (scripts/setup --tests installs it) or a cached root file system"
    return None


def _rootfs_tar() -> Path:
    cache = Path(os.environ.get("GOVERNOR_ROOTFS_CACHE", "/var/lib/governor/rootfs"))
    key = hashlib.sha256(" ".join(MMDEBSTRAP).encode()).hexdigest()[:12]
    return cache / f"{SUITE}-{key}.tar"


def _rootfs(dest: Path) -> None:
    """A fresh copy of the cached minimal bookworm in dest (made once with mmdebstrap)."""
    tar = _rootfs_tar()
    tar.parent.mkdir(parents=True, exist_ok=True)
    with (tar.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one mmdebstrap per cache
        if not tar.exists():
            part = tar.with_suffix(".part.tar")
            subprocess.run(
                ["nice", "mmdebstrap", "--quiet", *MMDEBSTRAP, str(part)], check=True, timeout=900
            )
            part.rename(tar)
    # tar(1) as root keeps the owners, modes and device nodes mmdebstrap made
    subprocess.run(["tar", "-C", str(dest), "-xf", str(tar)], check=True, timeout=300)


def _wheelhouse(dest: Path) -> Path:
    """The wheel as `python -m build` makes it, and its dependencies (`pip download`)."""
    dist = dest / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheels = sorted(dist.glob("cgroup_governor-*.whl"))
    assert len(wheels) == 1, wheels
    house = dest / "wheelhouse"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(house), str(wheels[0])],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return house


def _chroot(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chroot", str(root), "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in ENV.items()), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.timeout(1200)
def test_the_wheel_installs_on_a_fresh_debian_with_man_pages_and_completion(
    tmp_path: Path,
) -> None:
    missing = _missing()
    if missing:
        if is_ci():
            pytest.fail(f"board install test: {missing}")
        pytest.skip(missing)
    root = tmp_path / "root"
    root.mkdir()
    _rootfs(root)
    shutil.copytree(_wheelhouse(tmp_path), root / "tmp/wheelhouse")
    shutil.copytree(REPO / "policies", root / "tmp/policies")
    shutil.copytree(REPO / "tests/fixtures/hosts", root / "tmp/hosts")
    for script in ("board-install.sh", "board-check.sh"):
        shutil.copy(HERE / script, root / "tmp" / script)
    assert not (root / "opt/governor").exists()

    install = _chroot(root, "bash", "-c", "WHEELHOUSE=/tmp/wheelhouse /tmp/board-install.sh")
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    check = _chroot(root, "bash", "-lic", "source /tmp/board-check.sh")
    out = check.stdout
    assert check.returncode == 0, out + check.stderr[-3000:]
    assert "Usage: governor [OPTIONS] COMMAND [ARGS]..." in out
    words = " ".join(out.split())  # man justifies its lines: compare the words
    assert "/opt/governor/share/man/man1/governor.1" in out
    assert "/opt/governor/share/man/man5/governor.toml.5" in out
    assert "GOVERNOR(1) User Commands GOVERNOR(1) NAME governor - cgroup v2 resource" in words
    assert "[MEMORY] The memory controller's files of the engine's group" in words
    assert "complete -o nosort -F _governor_completion governor" in out
    assert "tab governor sta: status" in out
    assert "tab governor status : npu-chat" in out
    assert "tab governor check : chat.toml sub/" in out
    assert "install rc=0" in out
    assert "ExecStart=/opt/governor/bin/governor launch --backend systemd" in out
