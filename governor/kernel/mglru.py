"""The multi-gen LRU's switches: /sys/kernel/mm/lru_gen/{enabled,min_ttl_ms}. Stdlib only.

Documentation/admin-guide/mm/multigen_lru.rst: ``enabled`` reads back a hex mask (``0x0007``):
0x0001 the main switch, 0x0002 clearing the accessed bit in leaf page table entries in batches,
0x0004 in non-leaf entries too. ``min_ttl_ms`` N > 0 keeps the working set of the last N ms from
eviction and "the OOM killer is triggered if this working set cannot be kept in memory"
(mm/vmscan.c lru_gen_age_node: a global OOM kill, not the group's). The directory exists only on
kernels built with CONFIG_LRU_GEN (6.1+); Debian's 6.1 builds it off
(CONFIG_LRU_GEN_ENABLED unset: 0x0000), its 6.12 and later boot with it on.

The parser takes text (``parse_enabled``); :class:`MglruReader` takes an injected /sys root.
"""

from __future__ import annotations

from pathlib import Path

from governor.record import record

LRU_GEN_ENABLED = "kernel/mm/lru_gen/enabled"  # under /sys
LRU_GEN_MIN_TTL_MS = "kernel/mm/lru_gen/min_ttl_ms"
LRU_GEN_MAIN_SWITCH = 0x0001  # the other bits only tune how the page tables are walked


@record(frozen=True)
class Mglru:
    """The multi-gen LRU on this kernel: ``built`` False when it has no lru_gen directory."""

    built: bool = False
    enabled: int = 0  # the mask as read (0x0007)
    min_ttl_ms: int | None = None  # None: unreadable
    error: str | None = None  # the switch exists but could not be read or parsed

    @property
    def on(self) -> bool:
        return self.built and bool(self.enabled & LRU_GEN_MAIN_SWITCH)


def parse_enabled(text: str) -> int:
    """``enabled``: the kernel prints ``0x%04x``; a bare number or y/n (what a write takes)
    is read too."""
    value = text.strip().lower()
    if value in ("y", "n"):
        return LRU_GEN_MAIN_SWITCH if value == "y" else 0
    try:
        return int(value, 16) if value.startswith("0x") else int(value)
    except ValueError:
        raise ValueError(f"lru_gen enabled: unexpected {text.strip()!r}") from None


@record
class MglruReader:
    """Reads the multi-gen LRU's switches under an injected /sys."""

    sys: Path = Path("/sys")

    def read(self) -> Mglru:
        path = self.sys / LRU_GEN_ENABLED
        try:
            text = path.read_text()
        except FileNotFoundError:
            return Mglru()  # not built (CONFIG_LRU_GEN=n, kernels before 6.1)
        except OSError as err:
            return Mglru(built=True, error=f"{path}: {err.strerror or err}")
        try:
            enabled = parse_enabled(text)
        except ValueError as err:
            return Mglru(built=True, error=f"{path}: {err}")
        try:
            ttl: int | None = int((self.sys / LRU_GEN_MIN_TTL_MS).read_text().strip())
        except (OSError, ValueError):
            ttl = None
        return Mglru(built=True, enabled=enabled, min_ttl_ms=ttl)
