"""A tiny busybox initramfs (newc cpio, written in pure Python) for the hand-made qemu guests.

Stage 1 (``/init``, busybox sh) loads the virtio/9p/overlay modules of the guest kernel,
mounts the host root read-only over 9p under a tmpfs-backed overlay, mounts the shared
read-write directory (9p tag ``vmshare``) at /run/vmshare and switch_roots into
``/bin/bash /run/vmshare/stage2.sh`` on the overlayed host root.
"""

from __future__ import annotations

import gzip
import lzma
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# kernel modules stage 1 needs (those built into the kernel are skipped)
STAGE1_MODULES: tuple[str, ...] = ("9p", "9pnet_virtio", "virtio_pci", "virtio_console", "overlay")

BUSYBOX_APPLETS: tuple[str, ...] = (
    "sh", "mount", "umount", "mkdir", "insmod", "switch_root", "cat", "echo", "sleep",
    "poweroff", "ls", "mv", "grep", "cp",
)  # fmt: skip

STAGE1_INIT = r"""#!/bin/sh
# governor test guest, stage 1 (busybox, in the initramfs)
export PATH=/bin
fail() {
    echo "guest stage1: $*"
    echo 125 > /newroot/run/vmshare/rc 2>/dev/null
    poweroff -f; sleep 60
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
grep -q vm.debug /proc/cmdline && set -x
for m in $(cat /modules.order); do insmod "/lib/modules/$m" || echo "guest stage1: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 rootfs /lower \
    || fail "cannot mount the host root over 9p"
mount -t tmpfs -o mode=0755 ovl /ovl
mkdir -p /ovl/upper /ovl/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/ovl/upper,workdir=/ovl/work /newroot \
    || fail "cannot mount the overlay root"
mount -t tmpfs -o mode=0755,nosuid,nodev run /newroot/run
mkdir -p /newroot/run/vmshare /newroot/run/vm
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 vmshare /newroot/run/vmshare \
    || fail "cannot mount the shared directory"
cp /bin/busybox /newroot/run/vm/busybox
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
exec switch_root /newroot /bin/bash /run/vmshare/stage2.sh
fail "switch_root failed"
"""

_S_IFDIR = 0o040000
_S_IFREG = 0o100000
_S_IFLNK = 0o120000
_S_IFCHR = 0o020000


@dataclass(frozen=True)
class Entry:
    name: str  # path inside the archive, without leading "/"
    mode: int  # including the file type bits
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


class Newc:
    """Writer for the "newc" (SVR4, no CRC) cpio format the kernel unpacks."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def dir(self, name: str, mode: int = 0o755) -> None:
        self.entries.append(Entry(name, _S_IFDIR | mode))

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self.entries.append(Entry(name, _S_IFREG | mode, data))

    def symlink(self, name: str, target: str) -> None:
        self.entries.append(Entry(name, _S_IFLNK | 0o777, target.encode()))

    def chardev(self, name: str, major: int, minor: int, mode: int = 0o600) -> None:
        self.entries.append(Entry(name, _S_IFCHR | mode, rdev=(major, minor)))

    @staticmethod
    def _record(ino: int, e: Entry) -> bytes:
        name = e.name.encode() + b"\0"
        nlink = 2 if e.mode & 0o170000 == _S_IFDIR else 1
        fields = (
            ino, e.mode, 0, 0, nlink, 0, len(e.data), 0, 0, e.rdev[0], e.rdev[1], len(name), 0,
        )  # fmt: skip
        head = b"070701" + b"".join(b"%08X" % f for f in fields)
        out = head + name
        out += b"\0" * (-len(out) % 4)
        out += e.data + b"\0" * (-len(e.data) % 4)
        return out

    def tobytes(self) -> bytes:
        chunks = [self._record(i + 1, e) for i, e in enumerate(self.entries)]
        chunks.append(self._record(0, Entry("TRAILER!!!", 0)))
        return b"".join(chunks)


def module_files(
    kver: str, modules: tuple[str, ...] = STAGE1_MODULES, basedir: Path | None = None
) -> list[Path]:
    """The .ko files (with dependencies, in load order) for `modules` of kernel `kver`, under
    /lib/modules of the host or of the root tree `basedir` (another architecture's guest)."""
    out: list[Path] = []
    base = [] if basedir is None else ["-d", str(basedir)]
    for m in modules:
        res = subprocess.run(
            ["modprobe", *base, "-S", kver, "--show-depends", m],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"modprobe --show-depends {m} for {kver}: {res.stderr.strip()}")
        for line in res.stdout.splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "insmod":
                p = Path(words[1])
                if p not in out:
                    out.append(p)
    return out


def read_module(path: Path) -> tuple[str, bytes]:
    """(file name without compression suffix, uncompressed bytes)"""
    name = path.name
    if name.endswith(".ko"):
        return name, path.read_bytes()
    if name.endswith(".ko.xz"):
        return name[:-3], lzma.decompress(path.read_bytes())
    if name.endswith(".ko.gz"):
        return name[:-3], gzip.decompress(path.read_bytes())
    if name.endswith(".ko.zst"):
        res = subprocess.run(["zstd", "-qdc", str(path)], capture_output=True, check=True)
        return name[:-4], res.stdout
    raise RuntimeError(f"unknown kernel module format: {path}")


def find_busybox() -> Path:
    for cand in (shutil.which("busybox"), "/bin/busybox", "/usr/bin/busybox"):
        if cand and Path(cand).exists():
            return Path(cand)
    raise RuntimeError("busybox not found (apt-get install busybox-static)")


def build(
    kver: str, busybox: Path | None = None, init: str = STAGE1_INIT, basedir: Path | None = None
) -> bytes:
    """The stage-1 initramfs image for kernel version `kver` (modules from `basedir`'s
    /lib/modules when given: module_files)."""
    bb = busybox or find_busybox()
    a = Newc()
    for d in ("bin", "dev", "proc", "sys", "lower", "ovl", "newroot", "lib", "lib/modules"):
        a.dir(d)
    a.chardev("dev/console", 5, 1)
    a.chardev("dev/null", 1, 3, 0o666)
    a.file("bin/busybox", bb.read_bytes(), 0o755)
    for applet in BUSYBOX_APPLETS:
        a.symlink(f"bin/{applet}", "busybox")
    order: list[str] = []
    for ko in module_files(kver, basedir=basedir):
        name, data = read_module(ko)
        a.file(f"lib/modules/{name}", data)
        order.append(name)
    a.file("modules.order", "".join(f"{n}\n" for n in order).encode())
    a.file("init", init.encode(), 0o755)
    return a.tobytes()
