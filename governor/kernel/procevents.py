"""The kernel's process events connector (issue 46 item 5): an ``exec`` anywhere on the board is
told at once, so a router's child is moved into its model's leaf right after its exec instead
of up to one poll later (supervise/models.py POLL_S). cgroup v2 does not move the charges a
process made before its move (cgroup-v2.rst "Memory Ownership"): what a child allocated (and
the pages of its model file it read) before its move stays charged to the router's leaf.

The connector (linux/cn_proc.h, drivers/connector/cn_proc.c): a NETLINK_CONNECTOR socket bound
to the CN_IDX_PROC group, a PROC_CN_MCAST_LISTEN message, then one ``struct proc_event`` per
fork, exec, exit ... of every process. It needs CAP_NET_ADMIN (root) and CONFIG_PROC_EVENTS;
without either :func:`open_exec_events` raises OSError and the caller polls only. Standard
library only (the supervisor imports it)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import threading

NETLINK_CONNECTOR = 11  # linux/netlink.h
CN_IDX_PROC = 1  # linux/connector.h
CN_VAL_PROC = 1
NLMSG_DONE = 3
PROC_CN_MCAST_LISTEN = 1  # linux/cn_proc.h enum proc_cn_mcast_op
PROC_CN_MCAST_IGNORE = 2
PROC_EVENT_EXEC = 0x00000002  # linux/cn_proc.h enum what
NLMSG = struct.Struct("=IHHII")  # struct nlmsghdr: len, type, flags, seq, pid
CN_MSG = struct.Struct("=IIIIHH")  # struct cn_msg: id.idx, id.val, seq, ack, len, flags
# struct proc_event: what, cpu, timestamp_ns (aligned 8), then exec's process_pid, process_tgid
EVENT = struct.Struct("=IIQII")
RECV = 1 << 13
WAIT_S = 0.5  # the listener looks at its stop flag this often


def exec_pids(data: bytes) -> list[int]:
    """The tgids of the exec events in one netlink datagram (pure; anything that is no whole
    proc_event is skipped)."""
    out: list[int] = []
    at = 0
    while at + NLMSG.size <= len(data):
        length = NLMSG.unpack_from(data, at)[0]
        if length < NLMSG.size or at + length > len(data):
            break
        body = at + NLMSG.size
        if length >= NLMSG.size + CN_MSG.size + EVENT.size:
            idx, val = CN_MSG.unpack_from(data, body)[:2]
            what, _cpu, _ts, _pid, tgid = EVENT.unpack_from(data, body + CN_MSG.size)
            if (idx, val) == (CN_IDX_PROC, CN_VAL_PROC) and what == PROC_EVENT_EXEC:
                out.append(tgid)
        at += (length + 3) & ~3  # NLMSG_ALIGN
    return out


def listen_message(what: int = PROC_CN_MCAST_LISTEN) -> bytes:
    """The PROC_CN_MCAST_LISTEN request, or ``what`` (PROC_CN_MCAST_IGNORE) (pure)."""
    op = struct.pack("=I", what)
    cn = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0)
    return NLMSG.pack(NLMSG.size + len(cn) + len(op), NLMSG_DONE, 0, 0, os.getpid()) + cn + op


def open_exec_events() -> socket.socket:
    """A socket that receives the board's process events; OSError without the connector or
    without CAP_NET_ADMIN (EPERM), EPROTONOSUPPORT on a kernel without it."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    try:
        sock.bind((0, CN_IDX_PROC))
        sock.send(listen_message())
        sock.settimeout(WAIT_S)
    except BaseException:
        sock.close()
        raise
    return sock


class ExecWaker:
    """Sets ``wake`` at every exec on the board, from its own thread, until :meth:`stop`.
    :meth:`start` returns None where the connector cannot be had (the caller polls only)."""

    def __init__(self, sock: socket.socket, wake: threading.Event) -> None:
        self.sock, self.wake = sock, wake
        self.execs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="exec-events", daemon=True)

    @classmethod
    def start(cls, wake: threading.Event) -> ExecWaker | None:
        try:
            sock = open_exec_events()
        except OSError:
            return None
        waker = cls(sock, wake)
        waker._thread.start()
        return waker

    def stop(self) -> None:
        """The thread ended, then IGNORE before the close: the kernel counts listeners
        (cn_proc.c proc_event_num_listeners) by LISTEN and IGNORE, and before 6.6 a socket's
        close does not take its LISTEN back, so each run would leave every fork, exec and exit
        on the board building an event for nobody."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=WAIT_S + 1)
        with contextlib.suppress(OSError):  # the socket is closed below either way
            self.sock.send(listen_message(PROC_CN_MCAST_IGNORE))
        self.sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(RECV)
            except TimeoutError:
                continue
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    return  # the poll alone from now on
                self.wake.set()  # events were dropped: the poll finds what they said
                continue
            if exec_pids(data):
                self.execs += 1
                self.wake.set()
