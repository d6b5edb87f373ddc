"""An engine stand-in that holds GPU-style device memory: vgem GEM buffers (shmem-backed, like
panfrost/panthor's), some exported as dma-buf fds (PRIME) and one shared with a child process.

    python tests/helpers/vgem.py CARD READY_FILE --buffers 3 --mib 16 --export 2

Creates ``--buffers`` dumb buffers of ``--mib`` MiB on CARD (/dev/dri/cardN of vgem), exports
the first ``--export`` of them as dma-buf fds, mmaps those and writes every page (so their
shmem is allocated and charged to this process's memcg), forks a child after the first export
(it inherits that dma-buf fd and its mapping: the same buffer in two processes), writes READY_FILE
(JSON: pids, the exported buffers' inodes) and sleeps until killed. The unexported buffers are
never touched: they hold no pages and no fd shows them (vgem on 6.1 prints no drm-* memory).

ioctls (include/uapi/drm/drm.h, drm_mode.h): DRM_IOCTL_MODE_CREATE_DUMB = _IOWR('d', 0xB2,
struct drm_mode_create_dumb) = 0xC02064B2; DRM_IOCTL_PRIME_HANDLE_TO_FD = _IOWR('d', 0x2D, struct
drm_prime_handle) = 0xC00C642D. Needs: root (or the video group), `modprobe vgem`.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import mmap
import os
import signal
import struct
import time
from pathlib import Path

MODE_CREATE_DUMB = 0xC02064B2
PRIME_HANDLE_TO_FD = 0xC00C642D
DRM_CLOEXEC_RDWR = os.O_CLOEXEC | os.O_RDWR
WIDTH, BPP = 1024, 32  # 4 KiB per row: height = bytes / 4096


def create_dumb(card: int, nbytes: int) -> tuple[int, int]:
    """(GEM handle, size) of a new dumb buffer of at least ``nbytes``."""
    # struct drm_mode_create_dumb { u32 height, width, bpp, flags; u32 handle, pitch; u64 size }
    arg = bytearray(struct.pack("=IIIIIIQ", nbytes // (WIDTH * BPP // 8), WIDTH, BPP, 0, 0, 0, 0))
    fcntl.ioctl(card, MODE_CREATE_DUMB, arg)
    _h, _w, _b, _f, handle, _pitch, size = struct.unpack("=IIIIIIQ", arg)
    return handle, size


def export(card: int, handle: int) -> int:
    """A dma-buf fd of the GEM object (PRIME)."""
    # struct drm_prime_handle { u32 handle; u32 flags; s32 fd }
    arg = bytearray(struct.pack("=IIi", handle, DRM_CLOEXEC_RDWR, -1))
    fcntl.ioctl(card, PRIME_HANDLE_TO_FD, arg)
    return int(struct.unpack("=IIi", arg)[2])


def touch(fd: int, size: int) -> mmap.mmap:
    """Map the dma-buf and write every page: its shmem pages are allocated now."""
    m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    for off in range(0, size, mmap.PAGESIZE):
        m[off] = 1
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("card")
    ap.add_argument("ready")
    ap.add_argument("--buffers", type=int, default=3)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--export", type=int, default=2)
    a = ap.parse_args()
    card = os.open(a.card, os.O_RDWR | os.O_CLOEXEC)
    handles = [create_dumb(card, a.mib << 20) for _ in range(a.buffers)]
    kept: list[mmap.mmap] = []
    inodes: list[int] = []
    child = 0
    for i, (handle, size) in enumerate(handles[: a.export]):
        fd = export(card, handle)
        os.set_inheritable(fd, True)
        inodes.append(os.fstat(fd).st_ino)
        kept.append(touch(fd, size))
        if i == 0:
            child = os.fork()
            if child == 0:  # the second process: holds the first buffer only (inherited)
                signal.pause()
                os._exit(0)
    Path(a.ready).write_text(json.dumps({"pids": [os.getpid(), child], "inodes": inodes}))
    try:
        while True:
            time.sleep(3600)
    finally:
        os.kill(child, signal.SIGKILL)


if __name__ == "__main__":
    main()
