"""Byte counts (and durations) as people and the kernel spell them (standard library only: the
run time's messages use these too)."""

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


# a duration's units, largest first: "2m", "150ms", "1us" (the policy's spelling, policy/durations.py)
DURATION_US = {"h": 3_600_000_000, "m": 60_000_000, "s": 1_000_000, "ms": 1000, "us": 1}


def duration_text(us: int) -> str:
    """``us`` microseconds in the largest unit that divides it ("90s", "2m", "1us")."""
    for unit, mult in DURATION_US.items():
        if us % mult == 0 and us >= mult:
            return f"{us // mult}{unit}"
    return f"{us}us"
