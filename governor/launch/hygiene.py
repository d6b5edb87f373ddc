"""What the engine must not inherit from the governor across exec."""

from __future__ import annotations

import contextlib
import os
import resource
import signal

_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


def exec_hygiene(keep_fd: int) -> None:
    """What the engine must not inherit from the governor (as systemd's exec does): every signal
    back to its default disposition (Python ignores SIGPIPE and SIGXFSZ, and an ignored signal
    stays ignored across exec, so `engine | head` would see EPIPE instead of dying), an empty
    signal mask, and no file descriptor beyond 0-2 (a shell's `9</etc/shadow` must not reach an
    engine that runs as another user). ``keep_fd`` is the close-on-exec status pipe."""
    for sig in signal.valid_signals():
        if sig in _UNCATCHABLE:
            continue
        with contextlib.suppress(OSError, ValueError):  # glibc's reserved RT signals refuse
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    # close_range(2) under the hood where the kernel has it (>= 5.9), a loop otherwise
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, _fd_ceiling())


def _fd_ceiling() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = max(soft, hard) if hard != resource.RLIM_INFINITY else soft
    return min(max(ceiling, 1024), 1 << 20)
