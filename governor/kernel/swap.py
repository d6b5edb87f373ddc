"""The board's swap, known: /proc/swaps, each zram device's mm_stat, zswap's state. Stdlib only.

zram is a block device whose pages are compressed into memory that NO cgroup is charged for
(drivers/block/zram/zram_drv.c allocates from its own zsmalloc pool): a slice at its memory.max
with swap allowed keeps growing the board's used memory through zram. So the board's budget
counts zram's ``mem_used_total`` as used. zswap compresses pages on their way to a swap device
into a pool that IS charged to the page's cgroup (memory.zswap.current, 5.19+), and a cgroup can
cap it (memory.zswap.max) and, since 6.8, forbid writeback to the device (memory.zswap.writeback).

Parsers take text (``parse_swaps``, ``parse_mm_stat``), :class:`SwapReader` takes an injected
/proc and /sys root (tests build a tmp tree).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from governor.kernel.procfs import ProcFs
from governor.record import record

SwapKind = Literal["zram", "zswap", "disk"]

# Documentation/admin-guide/blockdev/zram.rst, "mm_stat": the columns in order (later kernels
# append more; older ones have fewer: only those present are filled in)
MM_STAT_COLUMNS = (
    "orig_data_size",  # uncompressed bytes stored
    "compr_data_size",  # compressed bytes stored
    "mem_used_total",  # memory the pool took, metadata and fragmentation included
    "mem_limit",
    "mem_used_max",
    "same_pages",
    "pages_compacted",
    "huge_pages",
    "huge_pages_since",
)
ZSWAP_ENABLED = "module/zswap/parameters/enabled"  # under /sys: "Y" / "N"


@record(frozen=True)
class SwapDevice:
    """One /proc/swaps line, sizes in bytes (the file says KiB)."""

    name: str  # /dev/zram0, /swapfile
    type: str  # partition | file
    size: int
    used: int
    priority: int

    @property
    def zram(self) -> str | None:
        """``zram0`` for a zram device, else None."""
        base = self.name.rsplit("/", 1)[-1]
        return base if base.startswith("zram") and base[4:].isdigit() else None


@record(frozen=True)
class ZramStat:
    """A zram device's mm_stat (bytes)."""

    device: str
    orig_data_size: int
    compr_data_size: int
    mem_used_total: int


@record(frozen=True)
class BoardSwap:
    """What the board swaps to and what it costs."""

    devices: tuple[SwapDevice, ...] = ()
    zram: tuple[ZramStat, ...] = ()
    zswap_enabled: bool | None = None  # None: no zswap in this kernel (or /sys unreadable)
    # /proc/swaps could not be read or parsed: the devices are unknown, not none
    swaps_error: str | None = None
    # zram devices whose mm_stat could not be read: their pool is missing from zram_used
    zram_errors: tuple[str, ...] = ()

    @property
    def kinds(self) -> tuple[SwapKind, ...]:
        """The swap in use, in the order a page meets it: zswap first, then the devices."""
        out: list[SwapKind] = []
        if self.zswap_enabled and self.devices:  # zswap needs a swap device behind it
            out.append("zswap")
        if any(d.zram for d in self.devices):
            out.append("zram")
        if any(not d.zram for d in self.devices):
            out.append("disk")
        return tuple(out)

    @property
    def size(self) -> int | None:
        """The swap's total size (SwapTotal), None when /proc/swaps could not be read."""
        return None if self.swaps_error is not None else sum(d.size for d in self.devices)

    @property
    def zram_used(self) -> int:
        """Board memory zram holds (mem_used_total over the devices): charged to no cgroup."""
        return sum(z.mem_used_total for z in self.zram)

    @property
    def zram_stored(self) -> int:
        """Uncompressed bytes swapped to zram."""
        return sum(z.orig_data_size for z in self.zram)

    @property
    def zram_free(self) -> int:
        """SwapFree of the zram devices (their size less what they hold)."""
        return sum(d.size - d.used for d in self.devices if d.zram)

    @property
    def zram_ratio(self) -> float | None:
        """Bytes stored per byte of board memory zram's pool takes (orig_data_size over
        mem_used_total: metadata and fragmentation count against it); None before it holds
        anything, or when a device's mm_stat could not be read."""
        used = self.zram_used
        return None if used <= 0 or self.zram_errors else self.zram_stored / used

    def zram_room(self, available: int) -> int:
        """Board memory usable zram could still free now (:func:`zram_room`)."""
        return zram_room(self.zram_free, available, self.zram_ratio)

    @property
    def disk_used(self) -> int:
        return sum(d.used for d in self.devices if not d.zram)

    @property
    def kind(self) -> SwapKind | Literal["none"]:
        """The board's main swap, the one a policy's swap_max sends pages to."""
        kinds = self.kinds
        if "zram" in kinds:
            return "zram"
        return kinds[0] if kinds else "none"

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "kinds": list(self.kinds),
            "zswap_enabled": self.zswap_enabled,
            "devices": [
                {"name": d.name, "type": d.type, "size": d.size, "used": d.used}
                for d in self.devices
            ],
            "zram": [
                {
                    "device": z.device,
                    "orig_data_size": z.orig_data_size,
                    "compr_data_size": z.compr_data_size,
                    "mem_used_total": z.mem_used_total,
                }
                for z in self.zram
            ],
            "zram_used": self.zram_used,
            "zram_stored": self.zram_stored,
            "disk_used": self.disk_used,
        }


def parse_swaps(text: str) -> tuple[SwapDevice, ...]:
    """/proc/swaps: a header, then ``Filename Type Size Used Priority`` (KiB). A name with a
    space is escaped by the kernel (seq_file_path: ``\\040``), so whitespace splits safely."""
    out: list[SwapDevice] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 5:
            raise ValueError(f"/proc/swaps: unexpected line {line!r}")
        name, kind, size, used, prio = fields
        out.append(SwapDevice(name, kind, int(size) * 1024, int(used) * 1024, int(prio)))
    return tuple(out)


def parse_mm_stat(text: str, device: str = "zram0") -> ZramStat:
    """/sys/block/zramN/mm_stat: space-separated numbers (MM_STAT_COLUMNS), bytes."""
    values = [int(tok) for tok in text.split()]
    if len(values) < 3:
        raise ValueError(f"{device}/mm_stat: expected at least 3 numbers, got {text.strip()!r}")
    got = dict(zip(MM_STAT_COLUMNS, values, strict=False))
    return ZramStat(
        device=device,
        orig_data_size=got["orig_data_size"],
        compr_data_size=got["compr_data_size"],
        mem_used_total=got["mem_used_total"],
    )


def parse_zswap_enabled(text: str) -> bool:
    """/sys/module/zswap/parameters/enabled: ``Y`` or ``N`` (a bool module parameter)."""
    value = text.strip()
    if value not in ("Y", "N", "1", "0"):
        raise ValueError(f"zswap enabled: unexpected {value!r}")
    return value in ("Y", "1")


@record
class SwapReader:
    """Reads the board's swap under an injected /proc and /sys."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")

    def read(self) -> BoardSwap:
        swaps_error = None
        try:
            devices = parse_swaps((self.proc / "swaps").read_text())
        except (OSError, ValueError) as err:
            swaps_error = f"{self.proc / 'swaps'}: {err}"
            devices = ()
        zram: list[ZramStat] = []
        zram_errors: list[str] = []
        for d in devices:
            if d.zram is None:
                continue
            path = self.sys / "block" / d.zram / "mm_stat"
            try:
                zram.append(parse_mm_stat(path.read_text(), d.zram))
            except (OSError, ValueError) as err:
                zram_errors.append(f"{path}: {err}")
        try:
            zswap: bool | None = parse_zswap_enabled((self.sys / ZSWAP_ENABLED).read_text())
        except (OSError, ValueError):
            zswap = None  # no zswap built in: not an error
        return BoardSwap(tuple(devices), tuple(zram), zswap, swaps_error, tuple(zram_errors))

    def available(self) -> int:
        """MemAvailable (bytes): what usable zram is weighed against; 0 when unreadable (then
        no zram is counted)."""
        try:
            return ProcFs(self.proc).meminfo().get("MemAvailable", 0)
        except (OSError, ValueError):
            return 0


def usable_zram(swap_free: int, available: int, ratio: float) -> int:
    """Swap zram can still take, as Android's lmkd counts it (lmkd.cpp get_free_swap, with
    ro.lmk.swap_compression_ratio): min(SwapFree, available x ratio). zram's free space is
    only as usable as the board memory left to hold it compressed: at ratio r, ``available``
    bytes of memory store ``available x r`` of swapped pages."""
    return max(0, min(swap_free, int(max(0, available) * ratio)))


def zram_room(swap_free: int, available: int, ratio: float | None) -> int:
    """Board memory that swapping usable zram's worth of anonymous pages frees: each byte
    swapped leaves memory and takes 1/ratio of it back in the pool, so usable x (1 - 1/ratio).
    0 without a measured ratio above 1 (nothing stored yet: no ratio to count on)."""
    if ratio is None or ratio <= 1:
        return 0
    return int(usable_zram(swap_free, available, ratio) * (1 - 1 / ratio))
