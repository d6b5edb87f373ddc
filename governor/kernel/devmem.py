"""Device memory a group's processes hold: DRM clients and dma-buf fds, read from fdinfo.

memcg does not see all of it (docs/devices.md): contiguous rknpu buffers are
charged to no cgroup, shmem-backed GEM objects are charged but are not in RSS. What the kernel
does print per open file (proc_pid_fdinfo(5)):

- a DRM fd (Documentation/gpu/drm-usage-stats.rst, ``drm_show_memory_stats`` from 6.5):
  ``drm-driver:`` (mandatory), ``drm-client-id:`` (one per open of the device: fds dup'ed or
  inherited by a child share it), ``drm-pdev:``, and per memory region
  ``drm-total-<region>``, ``drm-shared-``, ``drm-resident-``, ``drm-purgeable-``,
  ``drm-active-`` as ``<uint> [KiB|MiB]``; ``drm-memory-<region>`` is the deprecated alias of
  resident (amdgpu before 6.9);
- a dma-buf fd (drivers/dma-buf/dma-buf.c, dma_buf_show_fdinfo): ``size:`` (bytes),
  ``count:``, ``exp_name:`` (the exporter: ``drm`` for a PRIME export), optional ``name:``,
  and the generic ``ino:`` (one inode per buffer, whoever holds an fd of it).

Deduplicated: a dma-buf by its inode, however many fds and processes hold it; a DRM client by
driver + pdev + client id. Summed by (driver, region): a DRM client's ``drm-total-<region>``
(resident or the alias when a driver prints no total) under its ``drm-driver``; a dma-buf's
size under its exporter with region ``dma-buf``. A PRIME-exported GEM object is in both its
client's drm-total and, as a dma-buf, under its exporter: the two rows are two views, not a
sum. A buffer mmapped after its fd was closed holds no fd and is not seen.

The parsers are pure (text in); :class:`DeviceMemoryReader` is the door (an injected /proc).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.record import record

DMABUF_REGION = "dma-buf"
PRIME_EXPORTER = "drm"  # drm_prime.c exports with exp_name KBUILD_MODNAME
_UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
# drm-<kind>-<region>; xe's drm-total-cycles-<engine> is a cycle counter, not memory
_MEMORY_KEY = re.compile(r"drm-(total|shared|resident|purgeable|active|memory)-(.+)")
_NOT_MEMORY = ("cycles-",)
# which figure a region's bytes come from, in order of preference
_PREFERENCE = ("total", "resident", "memory")


@record(frozen=True)
class DrmClient:
    """One DRM client (an open of a DRM device), as its fdinfo says."""

    driver: str
    client_id: int | None
    pdev: str | None
    regions: Mapping[str, int]  # region -> bytes (total, else resident, else the alias)

    def key(self) -> tuple[str, str | None, int | None]:
        return (self.driver, self.pdev, self.client_id)


@record(frozen=True)
class DmaBuf:
    """One dma-buf fd: the buffer's inode, size and exporter."""

    ino: int
    size: int
    exporter: str


def _fields(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _amount(value: str, key: str) -> int:
    """``"36496 KiB"`` -> bytes; the unit is optional (bytes)."""
    number, _, unit = value.partition(" ")
    unit = unit.strip()
    if not number.isdigit() or unit not in _UNITS:
        raise ValueError(f"fdinfo {key}: expected '<uint> [KiB|MiB]', got {value!r}")
    return int(number) * _UNITS[unit]


def parse_drm_fdinfo(text: str) -> DrmClient | None:
    """A DRM fd's fdinfo -> DrmClient; None when the text has no ``drm-driver:`` (not a DRM
    fd, or a driver without usage stats such as the vendor rknpu or any driver before 6.5's
    memory helper, where only the generic pos/flags/mnt_id/ino lines are printed)."""
    f = _fields(text)
    driver = f.get("drm-driver")
    if not driver:
        return None
    found: dict[str, dict[str, int]] = {}
    for key, value in f.items():
        m = _MEMORY_KEY.fullmatch(key)
        if m is None or m[2].startswith(_NOT_MEMORY):
            continue
        found.setdefault(m[2], {})[m[1]] = _amount(value, key)
    regions = {}
    for region, kinds in found.items():
        for kind in _PREFERENCE:
            if kind in kinds:
                regions[region] = kinds[kind]
                break
    client = f.get("drm-client-id")
    return DrmClient(
        driver=driver,
        client_id=int(client) if client is not None and client.isdigit() else None,
        pdev=f.get("drm-pdev"),
        regions=regions,
    )


def parse_dmabuf_fdinfo(text: str) -> DmaBuf | None:
    """A dma-buf fd's fdinfo -> DmaBuf; None when it is not one (no ``exp_name:``)."""
    f = _fields(text)
    if "exp_name" not in f or "size" not in f:
        return None
    if not f["size"].isdigit() or not f.get("ino", "").isdigit():
        raise ValueError(f"dma-buf fdinfo: size {f['size']!r} / ino {f.get('ino')!r}")
    return DmaBuf(ino=int(f["ino"]), size=int(f["size"]), exporter=f["exp_name"])


def parse_fdinfo(text: str) -> DrmClient | DmaBuf | None:
    """Either kind of device-memory fd, or None for any other file."""
    if "exp_name:" in text:
        return parse_dmabuf_fdinfo(text)
    if "drm-driver:" in text:
        return parse_drm_fdinfo(text)
    return None


def summarize(seen: Iterable[DrmClient | DmaBuf]) -> dict[tuple[str, str], int]:
    """Deduplicated sum by (driver, region): dma-bufs by inode, DRM clients by their key; a
    client without an id is its own client (it cannot be matched to another fd)."""
    bufs: dict[int, DmaBuf] = {}
    clients: dict[object, DrmClient] = {}
    for i, item in enumerate(seen):
        if isinstance(item, DmaBuf):
            bufs[item.ino] = item
        else:
            clients[item.key() if item.client_id is not None else i] = item
    out: dict[tuple[str, str], int] = {}
    for buf in bufs.values():
        key = (buf.exporter, DMABUF_REGION)
        out[key] = out.get(key, 0) + buf.size
    for client in clients.values():
        for region, size in client.regions.items():
            key = (client.driver, region)
            out[key] = out.get(key, 0) + size
    return dict(sorted(out.items()))


def as_rows(summary: Mapping[tuple[str, str], int]) -> list[dict[str, object]]:
    """The summary as JSON rows: ``[{"driver", "region", "bytes"}]``."""
    return [{"driver": d, "region": r, "bytes": n} for (d, r), n in summary.items()]


class DeviceMemoryReader:
    """Reads /proc/<pid>/fdinfo of a group's processes (the group and its descendants)."""

    def __init__(self, fs: CgroupFs, proc: ProcFs) -> None:
        self.fs = fs
        self.proc = proc

    def pids(self, group: str) -> list[int]:
        """Every pid in ``group`` and below it; [] when it is gone."""
        return self.fs.procs_below(group)

    def fds(self, pid: int) -> list[DrmClient | DmaBuf]:
        """The device-memory fds of one process; [] when it is gone or not ours to read
        (fdinfo needs ptrace read access: another user's process without root)."""
        base = self.proc.path(pid, "fdinfo")
        try:
            names = os.listdir(base)
        except OSError:
            return []
        out: list[DrmClient | DmaBuf] = []
        for name in names:
            try:
                with open(os.path.join(base, name), "rb") as f:
                    text = f.read(16384).decode(errors="replace")
                item = parse_fdinfo(text)
            except (OSError, ValueError):
                continue  # closed meanwhile, or a driver's line this parser cannot read
            if item is not None:
                out.append(item)
        return out

    def group(self, group: str) -> dict[tuple[str, str], int]:
        """The group's device memory by (driver, region), deduplicated across its processes."""
        seen: list[DrmClient | DmaBuf] = []
        for pid in self.pids(group):
            seen += self.fds(pid)
        return summarize(seen)


def total(summary: Mapping[tuple[str, str], int]) -> int:
    """All device memory of a summary (the `device memory` rule's and the report's figure):
    the DRM clients' regions plus the dma-bufs, except PRIME exports (exporter ``drm``) when
    some DRM client printed its memory: those buffers are already in their client's
    drm-total. Where no driver prints memory stats (rknpu, any driver before 6.5), the
    dma-bufs are the only view and all count."""
    drm = sum(n for (_d, r), n in summary.items() if r != DMABUF_REGION)
    bufs = sum(
        n
        for (d, r), n in summary.items()
        if r == DMABUF_REGION and not (drm and d == PRIME_EXPORTER)
    )
    return drm + bufs
