"""Host-tier tests of the quadlet tier's pieces that need no guest (tests/vm/quadlet.py): the
tier's place in the harness, its stage 2 (podman's generator kept, every other masked), the
image tar for `podman import`, and the root file system's cache key."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from vm import harness, quadlet


def test_the_quadlet_tier_boots_debian_13s_kernel_and_the_host_never_runs_its_tests() -> None:
    assert harness.QUADLET_TIER in harness.GUEST_TIERS
    assert harness.tier_series(harness.QUADLET_TIER, "5.10") == quadlet.KERNEL == "6.12"
    assert "not quadlet" in harness.HOST_MARKEXPR
    assert harness.tier_suite(harness.QUADLET_TIER) == ("quadlet", "quadlet")
    argv = quadlet.guest_script("/run/vmshare", ["-k", "x"], 100.0)
    assert " python3 -m pytest " in argv and " tests/quadlet " in argv
    assert f"export PYTHONPATH={harness.ROOT}:{quadlet.SITE}\n" in argv
    assert "export GOVERNOR_QUADLET_IMAGE_TAR=/run/vmshare/image.tar\n" in argv


def _generators(stage2: str, tmp_path: Path, present: tuple[str, ...]) -> list[str]:
    """The generators the stage-2 loop leaves unmasked among ``present`` (run in bash on a tmp
    tree standing in for /usr/lib/systemd and /run/systemd)."""
    start = stage2.index("mkdir -p /run/systemd/system-generators")
    loop = stage2[start : stage2.index("shopt -u nullglob")]
    gens = tmp_path / "usr-gens"
    gens.mkdir(parents=True)
    for g in present:
        (gens / g).touch()
    script = (
        loop.replace("/run/systemd/system-generators", str(tmp_path / "run-gens"))
        .replace("/usr/lib/systemd/system-generators", str(gens))
        .replace("/etc/systemd/system-generators", str(tmp_path / "none"))
    )
    subprocess.run(["bash", "-c", script], check=True)
    masked = {p.name for p in (tmp_path / "run-gens").iterdir()}
    return [g for g in present if g not in masked]


def test_stage2_keeps_podmans_generator_and_masks_the_others(tmp_path: Path) -> None:
    present = ("podman-system-generator", "systemd-fstab-generator", "systemd-getty-generator")
    kept = _generators(quadlet.stage2(), tmp_path / "q", present)
    assert kept == ["podman-system-generator"]
    assert _generators(harness.systemd_stage2(), tmp_path / "s", present) == []


def test_stage2_mounts_the_tree_and_the_engine_and_configures_podman_for_a_guest() -> None:
    text = quadlet.stage2()
    assert f"m9p work {harness.ROOT}\n" in text
    assert f"m9p engine {quadlet.GUEST_ENGINE}\n" in text
    assert 'driver = "vfs"' in text and 'netns = "host"' in text
    assert "ln -sf /dev/null /run/systemd/system/systemd-firstboot.service" in text
    assert text.index("m9p work") < text.index("exec /lib/systemd/systemd")


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_image_tar_holds_the_server_the_model_and_the_libraries_ldd_names(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    (engine / "bin").mkdir(parents=True)
    (engine / "models").mkdir()
    true = Path(shutil.which("true") or "/bin/true")
    shutil.copy(true, engine / "bin" / "llama-server")
    (engine / "models" / "tiny-1.gguf").write_bytes(b"GGUF")
    (engine / "models" / "tiny.gguf").symlink_to("tiny-1.gguf")
    tar = quadlet.image_tar(tmp_path / "image.tar", engine)
    with tarfile.open(tar) as t:
        members = {m.name: m for m in t.getmembers()}
        model = t.extractfile(members["var/lib/governor/engine/models/tiny.gguf"])
        assert model is not None and model.read() == b"GGUF"  # the content, not the link
    assert members["var/lib/governor/engine/bin/llama-server"].isfile()
    libs = [n for n in members if "libc.so" in n]
    assert libs and all(members[n].isfile() for n in libs), sorted(members)
    loader = [n for n in members if n.startswith(("lib64/ld-linux", "lib/ld-linux"))]
    assert loader and members[loader[0]].isfile()
    assert members["tmp"].isdir()


def test_the_rootfs_key_follows_its_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    before = quadlet.rootfs_dir()
    assert before.name.startswith("trixie-quadlet-")
    assert "pydantic>=2.6,<3" in quadlet.wheels() and "pytest>=8" in quadlet.wheels()
    monkeypatch.setattr(quadlet, "DEBS", (*quadlet.DEBS, "strace"))
    assert quadlet.rootfs_dir() != before
