"""governor/peer/http.py, the one HTTP exchange with a peer (issue 43 item 1), against stand-in
peers on 127.0.0.1 (tests/helpers/peers.py) that trickle, flood or chunk byte by byte; and the
router client and the readiness probe that speak through it. Times are asserted only as "did
not hang" (well under what the unbounded client took: 25 s against a trickle)."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Iterator

import pytest
from helpers.peers import StandIn, flood, one_byte_chunks, trickle

from governor.peer.http import BODY_CAP, HEAD_CAP, HttpError, dechunk, exchange
from governor.peer.router import RouterClient, RouterError
from governor.supervise import ready

MIB = 1 << 20
OK = b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"data": []}'


@pytest.fixture
def peers() -> Iterator[list[StandIn]]:
    started: list[StandIn] = []
    yield started
    for peer in started:
        peer.close()


def _peer(peers: list[StandIn], serve: object) -> StandIn:
    peer = StandIn(serve)  # type: ignore[arg-type]
    peers.append(peer)
    return peer


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def test_a_trickling_peer_is_an_error_within_the_whole_requests_deadline(
    peers: list[StandIn],
) -> None:
    peer = _peer(peers, trickle(OK, interval_s=0.2))  # a per-recv timeout of 2 s never fires
    t0 = time.monotonic()
    with pytest.raises(HttpError, match=rf"no whole answer within 2s \({peer.url}/models\)$"):
        exchange("127.0.0.1", peer.port, "GET", "/models", deadline_s=2.0)
    assert time.monotonic() - t0 < 10  # did not hang: 2 s and a margin
    client = RouterClient(peer.url, timeout=2.0)
    t0 = time.monotonic()
    with pytest.raises(RouterError, match=r"did not answer GET: no whole answer within 2s"):
        client.models()
    assert time.monotonic() - t0 < 10
    t0 = time.monotonic()
    assert ready.probe(ready.Endpoint("127.0.0.1", peer.port, "/health"), timeout=2.0) is None
    assert time.monotonic() - t0 < 10


def test_a_clients_budget_bounds_all_its_calls_together(peers: list[StandIn]) -> None:
    peer = _peer(peers, trickle(OK, interval_s=0.2))
    client = RouterClient(peer.url, timeout=5.0, budget_s=1.0)
    t0 = time.monotonic()
    assert client.busy("a") is None  # its slots: no answer within the budget
    assert client.unload("a") is False  # the budget is spent: not even asked
    assert time.monotonic() - t0 < 8
    assert peer.served == 1


def test_a_flooding_peer_is_an_error_at_the_cap_and_costs_little_memory(
    peers: list[StandIn],
) -> None:
    peer = _peer(peers, flood(300 * MIB))  # streamed: the stand-in holds 64 KiB
    before = _maxrss()
    t0 = time.monotonic()
    with pytest.raises(HttpError, match=rf"over the cap of {BODY_CAP} bytes \({peer.url}/models\)"):
        exchange("127.0.0.1", peer.port, "GET", "/models", deadline_s=10.0)
    with pytest.raises(RouterError, match="over the cap"):
        RouterClient(peer.url).models()
    took = time.monotonic() - t0
    grew = _maxrss() - before
    print(f"flood: 2 exchanges refused at the cap in {took:.3f}s, peak RSS grew {grew >> 20} MiB")
    assert grew < 64 * MIB  # the unbounded client took ~913 MiB for 300 MB
    assert took < 10


def test_a_content_length_over_the_cap_is_refused_before_its_body(peers: list[StandIn]) -> None:
    head = b"HTTP/1.0 200 OK\r\nContent-Length: 300000000\r\n\r\n"
    peer = _peer(peers, flood(300 * MIB, head=head))
    with pytest.raises(HttpError, match="its body of 300000000 bytes is over the cap"):
        exchange("127.0.0.1", peer.port, "GET", "/x", deadline_s=10.0)


def test_a_head_over_its_cap_is_refused(peers: list[StandIn]) -> None:
    head = b"HTTP/1.0 200 OK\r\n" + b"X-A: " + b"a" * (2 * HEAD_CAP)
    peer = _peer(peers, flood(0, head=head))
    with pytest.raises(HttpError, match=f"its head is over the cap of {HEAD_CAP} bytes"):
        exchange("127.0.0.1", peer.port, "GET", "/x", deadline_s=10.0)


def test_one_byte_chunks_are_decoded_correctly_and_in_linear_time(peers: list[StandIn]) -> None:
    body = json.dumps(
        {"data": [{"id": f"m{i}", "status": {"value": "loaded"}} for i in range(4000)]}
    )
    raw = body.encode()
    assert len(raw) > 100_000  # more than 100k one-byte chunks
    peer = _peer(peers, one_byte_chunks(raw))
    t0 = time.monotonic()
    answer = exchange("127.0.0.1", peer.port, "GET", "/models", deadline_s=30.0)
    took = time.monotonic() - t0
    assert (answer.status, answer.body) == (200, raw)
    assert len(RouterClient(peer.url, timeout=30.0).models()) == 4000
    wire = b"".join(b"1\r\n" + raw[i : i + 1] + b"\r\n" for i in range(len(raw))) + b"0\r\n\r\n"
    t0 = time.monotonic()
    assert dechunk(wire) == raw
    print(
        f"{len(raw)} one-byte chunks: {took:.3f}s over a socket, {time.monotonic() - t0:.3f}s dechunk"
    )


def test_dechunk_reads_extensions_and_refuses_what_is_no_chunked_body() -> None:
    assert dechunk(b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n") == b"abcde"
    assert dechunk(b"0\r\n\r\n") == b""
    with pytest.raises(ValueError, match="ends before its last chunk"):
        dechunk(b"3\r\nabc\r\n")
    with pytest.raises(ValueError, match="no hex number"):
        dechunk(b"zz\r\nabc\r\n0\r\n\r\n")
    with pytest.raises(ValueError, match="no CRLF after a chunk"):
        dechunk(b"3\r\nabcX\r\n0\r\n\r\n")
    with pytest.raises(OverflowError, match="over the cap of 4 bytes"):
        dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", cap=4)


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (b"", "it closed the connection without an answer"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "its answer is not HTTP: 'SSH-2.0-OpenSSH_9.2'"),
        (b"HTTP/1.0 200 OK\r\n", "its answer ends inside the head"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab",
            "ends before its last chunk",
        ),
    ],
)
def test_what_is_not_a_whole_http_answer_is_one_line_naming_the_url(
    peers: list[StandIn], answer: bytes, problem: str
) -> None:
    def serve(conn: object, _head: bytes) -> None:
        conn.sendall(answer)  # type: ignore[attr-defined]

    peer = _peer(peers, serve)
    with pytest.raises(HttpError) as err:
        exchange("127.0.0.1", peer.port, "GET", "/health", deadline_s=5.0)
    assert str(err.value) == f"{problem} ({peer.url}/health)" or problem in str(err.value)
    assert str(err.value).endswith(f"({peer.url}/health)") and "\n" not in str(err.value)


def test_a_post_sends_its_body_and_reads_the_answer(peers: list[StandIn]) -> None:
    seen: list[bytes] = []

    def serve(conn: object, head: bytes) -> None:
        seen.append(head)
        body = b'{"success": true}'
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))  # type: ignore[attr-defined]

    peer = _peer(peers, serve)
    assert RouterClient(peer.url).request("POST", "/models/unload", {"model": "a"}) == (
        200, {"success": True}
    )  # fmt: skip
    assert seen[0].startswith(b"POST /models/unload HTTP/1.0\r\n")
    assert b"Content-Length: 14\r\n" in seen[0] and seen[0].endswith(b'{"model": "a"}')
