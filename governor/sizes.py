"""Byte counts as people and the kernel spell them (standard library only: the run time's
messages use these too)."""

from __future__ import annotations

# Binary multipliers, as the kernel's memparse() and systemd read "K/M/G/T".
BINARY = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KiB": 1 << 10,
    "M": 1 << 20,
    "MiB": 1 << 20,
    "G": 1 << 30,
    "GiB": 1 << 30,
    "T": 1 << 40,
    "TiB": 1 << 40,
}
_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(n: int) -> str:
    """Shortest exact binary spelling: 1610612736 -> "1.5GiB", 4096 -> "4KiB", 1000 -> "1000"."""
    for unit, mult in _UNITS:
        if n >= mult and (n * 100) % mult == 0:
            hundredths = n * 100 // mult
            whole, frac = divmod(hundredths, 100)
            text = str(whole) if frac == 0 else f"{whole}.{frac:02d}".rstrip("0")
            return text + unit
    return str(n)


def human_bytes(n: int) -> str:
    """Approximate, for messages: 1234567890 -> "1.15GiB"."""
    for unit, mult in _UNITS:
        if n >= mult:
            return f"{n / mult:.2f}".rstrip("0").rstrip(".") + unit
    return f"{n}B"
