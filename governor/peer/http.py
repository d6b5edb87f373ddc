"""The one HTTP exchange with a peer (issue 43 item 1): llama-server's /health (the readiness
probe, supervise/ready.py) and its router's /models, /slots and /models/unload
(peer/router.py).

A peer may trickle (a byte a second: a per-``recv`` timeout never fires), flood (300 MB of
answer) or chunk its answer into one-byte pieces. :func:`exchange` bounds all three:

- one monotonic deadline for the whole request: the connect, the send and every ``recv`` get
  the time that is left, not a fresh timeout each (Go's ``http.Client{Timeout}``);
- a cap on the head (``HEAD_CAP``) and on the body (``BODY_CAP`` unless given): a
  ``Content-Length`` over it is refused before a byte of the body is read, a body that grows
  past it is refused at that byte, never buffered further (``io.LimitReader``);
- ``Transfer-Encoding: chunked`` (llama-server's router answers a proxied GET so, even to
  HTTP/1.0) is decoded as it arrives, by an index into the received bytes: linear in the
  answer's size whatever its chunks (RFC 9112 section 7.1).

HTTP/1.0 with ``Connection: close``: one request per connection, the answer ends at EOF. A
host name is resolved by ``getaddrinfo`` before the deadline starts to count (the governor's
peers are addresses: llama-server's --host). Standard library only (the run time imports it).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from governor.errors import GovernorError
from governor.record import record

__all__ = ["BODY_CAP", "HEAD_CAP", "Answer", "HttpError", "dechunk", "exchange"]

BODY_CAP = 4 << 20  # an answer's body: llama-server's /models and /slots are KiB
HEAD_CAP = 16 << 10  # the status line and the headers
LINE_CAP = 4 << 10  # one chunk-size line (the size and its extensions)
RECV = 1 << 16


class HttpError(GovernorError):
    """The peer did not answer within the deadline, answered more than the cap or something
    that is not HTTP. ``url`` is the peer's, ``problem`` what went wrong; one line."""

    def __init__(self, problem: str, *, url: str) -> None:
        super().__init__(f"{problem} ({url})")
        self.url = url
        self.problem = problem


@record(frozen=True)
class Answer:
    status: int
    body: bytes = b""


class _Chunked:
    """A chunked body decoded as it arrives: :meth:`feed` the bytes received, ``body`` holds
    what was decoded, ``done`` once the last chunk (size 0) came. Walks an index into its
    buffer and drops what it consumed only once that is most of it: every byte is copied a
    bounded number of times (no ``rest = rest[size + 2:]``)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.body = bytearray()
        self.done = False
        self._buf = bytearray()
        self._pos = 0
        self._need = 0  # data bytes left of the current chunk
        self._crlf = False  # the CRLF after a chunk's data is next

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        buf = self._buf
        buf += data
        while not self.done:
            if self._need:
                take = min(self._need, len(buf) - self._pos)
                if take == 0:
                    break
                self.body += buf[self._pos : self._pos + take]
                self._pos += take
                self._need -= take
                self._crlf = self._need == 0
                continue
            if self._crlf:
                if len(buf) - self._pos < 2:
                    break
                if buf[self._pos : self._pos + 2] != b"\r\n":
                    raise ValueError("no CRLF after a chunk")
                self._pos += 2
                self._crlf = False
                continue
            eol = buf.find(b"\r\n", self._pos)
            if eol < 0:
                if len(buf) - self._pos > LINE_CAP:
                    raise ValueError(f"a chunk-size line over {LINE_CAP} bytes")
                break
            line = bytes(buf[self._pos : eol]).split(b";", 1)[0].strip()
            self._pos = eol + 2
            try:
                size = int(line, 16)
            except ValueError:
                raise ValueError(f"a chunk size that is no hex number: {line[:20]!r}") from None
            if size < 0:
                raise ValueError(f"a negative chunk size: {line[:20]!r}")
            if size == 0:
                self.done = True  # trailers, if any, are not read
                break
            if len(self.body) + size > self.cap:
                raise OverflowError(f"its body is over the cap of {self.cap} bytes")
            self._need = size
        if self._pos > RECV and self._pos * 2 > len(buf):
            del buf[: self._pos]  # each byte is moved at most once more
            self._pos = 0


def dechunk(body: bytes, cap: int = BODY_CAP) -> bytes:
    """A whole chunked body as its bytes (linear); ValueError for one that is no chunked
    body or ends before its last chunk, OverflowError over ``cap``."""
    decoder = _Chunked(cap)
    decoder.feed(body)
    if not decoder.done:
        raise ValueError("the chunked body ends before its last chunk")
    return bytes(decoder.body)


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    """(status, {lower-case header name: value}) of an answer's head (its bytes up to the empty
    line); ValueError when it is not HTTP."""
    lines = raw.decode("latin-1").split("\r\n")
    words = lines[0].split(" ", 2)
    if len(words) < 2 or not words[0].startswith("HTTP/") or not words[1].isdigit():
        raise ValueError(f"its answer is not HTTP: {lines[0][:40]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(words[1]), headers


def exchange(
    host: str,
    port: int,
    method: str,
    path: str,
    *,
    deadline_s: float,
    body: bytes | None = None,
    content_type: str | None = None,
    cap: int = BODY_CAP,
    read_body: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> Answer:
    """One request to ``http://host:port`` and its answer, within ``deadline_s`` seconds in
    all; HttpError (naming the peer's URL) when it takes longer, answers more than ``cap``
    bytes of body or something that is not HTTP. ``read_body`` False: the status is enough
    (the readiness probe), the body is not read."""
    end = clock() + deadline_s
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}{path}"

    def left() -> float:
        remaining = end - clock()
        if remaining <= 0:
            raise TimeoutError(f"no whole answer within {deadline_s:.3g}s")
        return remaining

    data = b"" if body is None else body
    request = (
        f"{method} {path} HTTP/1.0\r\nHost: {shown}:{port}\r\nConnection: close\r\n"
        + (f"Content-Length: {len(data)}\r\n" if body is not None or method != "GET" else "")
        + (f"Content-Type: {content_type}\r\n" if content_type else "")
        + "\r\n"
    ).encode() + data
    try:
        with socket.create_connection((host, port), timeout=left()) as sock:
            sock.settimeout(left())
            sock.sendall(request)  # the timeout bounds the whole sendall (Python >= 3.5)
            raw = bytearray()
            while (split := raw.find(b"\r\n\r\n")) < 0:
                if len(raw) > HEAD_CAP:
                    raise OverflowError(f"its head is over the cap of {HEAD_CAP} bytes")
                sock.settimeout(left())
                got = sock.recv(RECV)
                if not got:
                    if not raw:
                        raise ConnectionError("it closed the connection without an answer")
                    raise ValueError("its answer ends inside the head")
                raw += got
            if split > HEAD_CAP:
                raise OverflowError(f"its head is over the cap of {HEAD_CAP} bytes")
            status, headers = _head(bytes(raw[:split]))
            if not read_body:
                return Answer(status)
            rest = raw[split + 4 :]
            del raw
            return Answer(status, _body(sock, rest, headers, cap, left))
    except TimeoutError:
        raise HttpError(f"no whole answer within {deadline_s:.3g}s", url=url) from None
    except OverflowError as err:
        raise HttpError(str(err), url=url) from None
    except ValueError as err:
        raise HttpError(str(err), url=url) from None
    except OSError as err:
        raise HttpError(f"{err.strerror or err}", url=url) from None


def _body(
    sock: socket.socket,
    first: bytearray,
    headers: dict[str, str],
    cap: int,
    left: Callable[[], float],
) -> bytes:
    """The body after the head (``first``: its bytes received with the head)."""
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length: int | None = None
    if not chunked and "content-length" in headers:
        raw_length = headers["content-length"]
        if not raw_length.isdigit():
            raise ValueError(f"a Content-Length that is no number: {raw_length[:20]!r}")
        length = int(raw_length)
        if length > cap:
            raise OverflowError(f"its body of {length} bytes is over the cap of {cap} bytes")
    if chunked:
        decoder = _Chunked(cap)
        decoder.feed(first)
        while not decoder.done:
            sock.settimeout(left())
            got = sock.recv(RECV)
            if not got:
                raise ValueError("the chunked body ends before its last chunk")
            decoder.feed(got)
        return bytes(decoder.body)
    out = first
    while length is None or len(out) < length:
        if len(out) > cap:
            raise OverflowError(f"its body is over the cap of {cap} bytes")
        sock.settimeout(left())
        got = sock.recv(RECV)
        if not got:
            break  # HTTP/1.0: the answer ends at EOF (a short one is the peer's)
        out += got
    if len(out) > cap:
        raise OverflowError(f"its body is over the cap of {cap} bytes")
    return bytes(out if length is None else out[:length])
