"""Start a child directly inside a cgroup: clone3(CLONE_INTO_CGROUP), with fork + a
cgroup.procs write as the fallback.

Why: a process that writes itself into cgroup.procs waits for an RCU grace period in
cgroup_attach (percpu_down_write on cgroup_threadgroup_rwsem), ~15 ms on this board's kind of
machine; a child created by clone3 with CLONE_INTO_CGROUP (Linux 5.7) is born in the target and
pays nothing. The child is also never charged outside the slice, not even for its first pages.

clone3 is called through ctypes on the C library's syscall(2) with the GIL held (PyDLL), and
Python's own fork protocol is kept around it: PyOS_BeforeFork / PyOS_AfterFork_Parent /
PyOS_AfterFork_Child run the interpreter's locks and os.register_at_fork() hooks exactly as
os.fork() does. A stack of 0 makes clone3 behave like fork (the child continues on a copy of
the parent's stack).

Fallback: ENOSYS (kernel < 5.3), E2BIG/EINVAL (< 5.7: no CLONE_INTO_CGROUP), or EPERM from a
seccomp filter that blocks clone3 (some container runtimes) -> None for the rest of the
process; EBADF (the fd is not a cgroup2 directory) -> None for this call. The caller then forks
and writes cgroup.procs. Errors about the cgroup itself (EACCES, EBUSY, EOPNOTSUPP, ENOENT) are
raised: a plain write would fail the same way.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal

SYS_CLONE3 = 435  # the same number on every architecture (asm-generic unified table, 5.3)
CLONE_PIDFD = 0x00001000
CLONE_INTO_CGROUP = 0x200000000  # <linux/sched.h>, 5.7
_FALLBACK_ERRNOS = frozenset({errno.ENOSYS, errno.E2BIG, errno.EINVAL, errno.EPERM})


class _CloneArgs(ctypes.Structure):
    _fields_ = (  # struct clone_args, CLONE_ARGS_SIZE_VER2 (88 bytes)
        ("flags", ctypes.c_uint64),
        ("pidfd", ctypes.c_uint64),
        ("child_tid", ctypes.c_uint64),
        ("parent_tid", ctypes.c_uint64),
        ("exit_signal", ctypes.c_uint64),
        ("stack", ctypes.c_uint64),
        ("stack_size", ctypes.c_uint64),
        ("tls", ctypes.c_uint64),
        ("set_tid", ctypes.c_uint64),
        ("set_tid_size", ctypes.c_uint64),
        ("cgroup", ctypes.c_uint64),
    )


class _State:
    unsupported = False  # set after the first fallback: do not try again in this process


_STATE = _State()


def clone_into(cgroup_fd: int) -> tuple[int, int] | None:
    """Create a child in the cgroup whose directory ``cgroup_fd`` is open.

    Returns ``(0, -1)`` in the child, ``(pid, pidfd)`` in the parent, or None when this kernel
    (or a seccomp filter) does not allow it: the caller then forks and joins by hand."""
    if _STATE.unsupported:
        return None
    libc = ctypes.PyDLL(None, use_errno=True)  # keep the GIL across the call (fork semantics)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    pidfd = ctypes.c_int(-1)
    args = _CloneArgs(
        flags=CLONE_INTO_CGROUP | CLONE_PIDFD,
        pidfd=ctypes.addressof(pidfd),
        exit_signal=signal.SIGCHLD,
        cgroup=cgroup_fd,
    )
    api = ctypes.pythonapi
    api.PyOS_BeforeFork()
    pid = syscall(
        ctypes.c_long(SYS_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args))
    )
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0, -1
    err = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid > 0:
        return pid, pidfd.value
    if err in _FALLBACK_ERRNOS:
        _STATE.unsupported = True
        return None
    if err == errno.EBADF:  # not a cgroup2 directory (a test tree): this fd only
        return None
    raise OSError(err, f"clone3(CLONE_INTO_CGROUP): {os.strerror(err)}")
