"""The process events connector's datagrams (governor/kernel/procevents.py), parsed from bytes
laid out as linux/connector.h and linux/cn_proc.h define them: exec events give their tgid,
every other event and anything cut short give nothing."""

from __future__ import annotations

import struct
import threading

from governor.kernel import procevents as pe

PROC_EVENT_FORK = 0x00000001


def _event(what: int, pid: int, tgid: int, *, idx: int = pe.CN_IDX_PROC) -> bytes:
    event = pe.EVENT.pack(what, 1, 123456789, pid, tgid)
    cn = pe.CN_MSG.pack(idx, pe.CN_VAL_PROC, 7, 0, len(event), 0)
    return pe.NLMSG.pack(pe.NLMSG.size + len(cn) + len(event), pe.NLMSG_DONE, 0, 7, 0) + cn + event


def test_an_exec_event_gives_its_tgid_and_other_events_nothing() -> None:
    assert pe.exec_pids(_event(pe.PROC_EVENT_EXEC, 4242, 4241)) == [4241]
    assert pe.exec_pids(_event(PROC_EVENT_FORK, 4242, 4241)) == []
    assert pe.exec_pids(_event(pe.PROC_EVENT_EXEC, 1, 1, idx=9)) == []  # another connector


def test_two_messages_in_one_datagram_and_a_cut_one() -> None:
    two = _event(pe.PROC_EVENT_EXEC, 10, 10) + _event(pe.PROC_EVENT_EXEC, 11, 11)
    assert pe.exec_pids(two) == [10, 11]
    whole = _event(pe.PROC_EVENT_EXEC, 10, 10)
    assert pe.exec_pids(whole[:-1]) == []  # its length says more than came
    assert pe.exec_pids(b"") == [] and pe.exec_pids(b"\0" * 16) == []


def test_the_listen_request_is_one_netlink_message_with_the_op() -> None:
    msg = pe.listen_message()
    length, kind = pe.NLMSG.unpack_from(msg)[:2]
    assert (length, kind) == (len(msg), pe.NLMSG_DONE)
    idx, val, _seq, _ack, size, _flags = pe.CN_MSG.unpack_from(msg, pe.NLMSG.size)
    assert (idx, val, size) == (pe.CN_IDX_PROC, pe.CN_VAL_PROC, 4)
    assert struct.unpack_from("=I", msg, pe.NLMSG.size + pe.CN_MSG.size) == (
        pe.PROC_CN_MCAST_LISTEN,
    )


class _Sock:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)

    def close(self) -> None:
        self.closed = True


def test_stop_takes_the_listen_back_before_the_close() -> None:
    """The kernel counts listeners by LISTEN and IGNORE (a close did not take a LISTEN back
    before 6.6): stop sends IGNORE, then closes."""
    sock = _Sock()
    waker = pe.ExecWaker(sock, threading.Event())  # type: ignore[arg-type]
    waker.stop()
    assert sock.closed and len(sock.sent) == 1
    assert struct.unpack_from("=I", sock.sent[0], pe.NLMSG.size + pe.CN_MSG.size) == (
        pe.PROC_CN_MCAST_IGNORE,
    )
