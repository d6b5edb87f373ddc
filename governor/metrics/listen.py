"""``[ADDR:]PORT`` for ``--metrics``: loopback unless an address is given. Standard library
only (the lean launch parser validates the option with it)."""

from __future__ import annotations

import ipaddress

DEFAULT_ADDR = "127.0.0.1"


def parse_listen(text: str) -> tuple[str, int]:
    """``9101`` -> (127.0.0.1, 9101); ``0.0.0.0:9101``, ``[::1]:9101``, ``localhost:9101``.
    ValueError saying what is wrong otherwise. Port 0 asks the kernel for a free port."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"expected [ADDR]:PORT, got {text!r}")
        ipaddress.IPv6Address(host)  # ValueError names the bad address
    elif ":" in text:
        host, _, port = text.rpartition(":")
        if not host or ":" in host:
            raise ValueError(f"expected ADDR:PORT (IPv6 as [ADDR]:PORT), got {text!r}")
    else:
        host, port = DEFAULT_ADDR, text
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"not a TCP port: {port!r}")
    return host, int(port)


def url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"
