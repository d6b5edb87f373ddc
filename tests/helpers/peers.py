"""Stand-in peers on 127.0.0.1 that misbehave as issue 43 item 1 found them: one that trickles
its answer a byte at a time, one that floods (an endless body, streamed: never held in
memory here), one that answers in one-byte chunks. Each connection is served in its own
thread until the client closes it (a send fails) or ``limit_s`` passed.

``fake_router_main`` is the same trickle as a program (the guest test runs it as a
"llama-server": /health answers 200 at once, every other path trickles)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable

Serve = Callable[[socket.socket, bytes], None]  # (connection, the request's head)


class StandIn:
    def __init__(self, serve: Serve, *, port: int = 0) -> None:
        self.serve = serve
        self.sock = socket.create_server(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.served = 0
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            conn.settimeout(10)
            try:
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    got = conn.recv(4096)
                    if not got:
                        return
                    head += got
                self.served += 1
                self.serve(conn, head)
            except OSError:
                return  # the client went away: what these peers wait for

    def close(self) -> None:
        self._closed.set()
        self.sock.close()


def trickle(answer: bytes, interval_s: float = 0.5, limit_s: float = 60.0) -> Serve:
    """``answer`` one byte per ``interval_s``, then (if it is all sent) a byte per interval
    more of spaces, until the client closes or ``limit_s`` passed."""

    def serve(conn: socket.socket, _head: bytes) -> None:
        end = time.monotonic() + limit_s
        data = iter(answer)
        while time.monotonic() < end:
            conn.sendall(bytes([next(data, 0x20)]))
            time.sleep(interval_s)

    return serve


def flood(
    total: int, head: bytes = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n"
) -> Serve:
    """``head`` then zeros, ``total`` bytes of them (no Content-Length: the body ends at EOF),
    64 KiB at a time from one buffer: the stand-in never holds more than that."""
    block = b"0" * 65536

    def serve(conn: socket.socket, _head: bytes) -> None:
        conn.sendall(head)
        sent = 0
        while sent < total:
            conn.sendall(block)
            sent += len(block)

    return serve


def one_byte_chunks(body: bytes) -> Serve:
    """``body`` chunked, one byte a chunk (RFC 9112 7.1), in writes of 64 KiB."""

    def serve(conn: socket.socket, _head: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        wire = bytearray()
        for i in range(len(body)):
            wire += b"1\r\n" + body[i : i + 1] + b"\r\n"
            if len(wire) >= 65536:
                conn.sendall(wire)
                wire.clear()
        conn.sendall(bytes(wire) + b"0\r\n\r\n")

    return serve


def fake_router_main() -> None:
    """A "llama-server" router that is ready at once and trickles everything else: argv
    ``... --port N ...`` (the rest ignored). Runs until killed."""
    argv = sys.argv
    port = int(argv[argv.index("--port") + 1])
    slow = trickle(
        b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"data": []}', 0.5, 3600
    )

    def serve(conn: socket.socket, head: bytes) -> None:
        if head.startswith(b"GET /health "):
            conn.sendall(b'HTTP/1.0 200 OK\r\nContent-Length: 15\r\n\r\n{"status":"ok"}')
            return
        slow(conn, head)

    StandIn(serve, port=port)
    threading.Event().wait()
