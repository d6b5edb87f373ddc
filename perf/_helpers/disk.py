"""Real page cache in the guests: an ext4 file system on a loop device.

The guests' /tmp is a tmpfs overlay (RAM, not page cache) and their 9p mounts bypass the page
cache for read(), so a test that needs reclaimable, evictable file pages charged to a cgroup
reads files from an ext4 loop mount whose image is a sparse file on a writable disk-backed
mount (the harness's shared results directory in the guest).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DISK_FS = ("9p", "ext4", "xfs", "btrfs", "virtiofs", "ext3", "f2fs")
MIB = 1 << 20


def writable_disk_dir() -> Path:
    """A writable directory on a disk-backed (not RAM) file system (GOVERNOR_TEST_DISK_DIR
    overrides)."""
    override = os.environ.get("GOVERNOR_TEST_DISK_DIR")
    if override:
        return Path(override)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        point, opts, fstype = fields[4], fields[5].split(","), rfields[0]
        if fstype in DISK_FS and "rw" in opts and os.access(point, os.W_OK) and point != "/":
            return Path(point)
    raise AssertionError(
        "no writable disk-backed mount for the loop image (GOVERNOR_TEST_DISK_DIR)"
    )


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=300)


@contextmanager
def loop_mount(mnt: Path, size_mib: int) -> Iterator[Path]:
    """Mount a fresh ext4 file system of `size_mib` (a sparse image) on `mnt`; unmounted and
    deleted afterwards."""
    image = writable_disk_dir() / f"governor-loop-{uuid.uuid4().hex[:8]}.img"
    subprocess.run(["modprobe", "loop"], capture_output=True, check=False)
    with open(image, "wb") as f:
        f.truncate(size_mib * MIB)
    try:
        _sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image))
        _sh("mount", "-o", "loop", str(image), str(mnt))
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], capture_output=True, check=False)
    finally:
        image.unlink(missing_ok=True)


def make_file(path: Path, mib: int) -> Path:
    """An `mib` MiB file of non-zero data, fsynced (reading it fills real page cache)."""
    block = bytes(range(256)) * (MIB // 256)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    path.chmod(0o644)
    return path
