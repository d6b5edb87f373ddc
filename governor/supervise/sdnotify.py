"""sd_notify(3) without libsystemd: one datagram of ``KEY=VALUE`` lines to ``$NOTIFY_SOCKET``.

The socket is an AF_UNIX datagram socket; a leading ``@`` names an abstract socket (the NUL
byte). Without ``$NOTIFY_SOCKET`` (not run by systemd with Type=notify) it does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def notify(state: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1\\nSTATUS=engine running"``); True if it was sent."""
    address = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False  # unset, or vsock:/other schemes this minimal client does not speak
    target = "\0" + address[1:] if address[0] == "@" else address
    import socket  # only under systemd: the lean launch path does not load _socket otherwise

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(target)
        sock.sendall(state.encode())
    return True
