"""scripts/setup knows the machine's architecture: the test tiers' guest packages are the ones
Debian has for it (qemu-system-arm and linux-image-arm64 on an arm64 board), and the main job
asks for none of them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def setup(tmp_path: Path, arch: str, *args: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "dpkg").write_text(f'#!/bin/sh\n[ "$1" = --print-architecture ] && echo {arch}\n')
    (fake / "dpkg").chmod(0o755)
    return subprocess.run(
        [str(REPO / "scripts/setup"), *args],
        env={"PATH": f"{fake}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("arch", "want", "not_want"),
    [
        ("amd64", {"qemu-system-x86", "linux-image-amd64"}, {"qemu-system-arm"}),
        (
            "arm64",
            {"qemu-system-arm", "linux-image-arm64"},
            {"qemu-system-x86", "linux-image-amd64"},
        ),
    ],
)
def test_the_guest_packages_follow_the_architecture(
    tmp_path: Path, arch: str, want: set[str], not_want: set[str]
) -> None:
    run = setup(tmp_path, arch, "--list-packages")
    assert run.returncode == 0, run.stderr
    packages = set(run.stdout.split())
    assert want <= packages
    assert not packages & not_want
    assert "busybox-static" in packages


def test_an_unknown_argument_is_a_usage_error(tmp_path: Path) -> None:
    run = setup(tmp_path, "amd64", "--test")
    assert run.returncode == 2
    assert "unknown argument: --test" in run.stderr
