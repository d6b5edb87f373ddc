"""Compile in a short-lived child so the supervisor stays lean after a plan-cache miss.

`governor launch` supervises its engine for as long as the engine runs. A cache miss needs the
compile-time stack (pydantic, the policy models, the compiler, the GGUF reader: ~16 MiB of PSS
measured), and once imported a module stays for the life of the process. So the lean path
(governor/main.py) compiles in a fork of itself: the child imports what compiling needs,
compiles, stores the entry, writes it as JSON on a pipe and exits; the parent (the future
supervisor) reads the entry and has imported nothing of the compiler.

An error in the child is printed by the child exactly as the one process printed it before
(``governor: ...`` + hint, governor/errors.py report) and the child's exit code becomes the
launch's: the parent raises :class:`governor.errors.Reported`, which main.py turns into that
code without printing anything again. A ^C reaches both (one process group): the child exits
quietly with 130 and the parent says it was interrupted, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable

from governor.errors import GovernorError, LaunchError, Reported, report

EXIT_CRASH = 70  # EX_SOFTWARE: an unexpected exception in the compile child (traceback shown)


def _prctl_pdeathsig() -> None:
    """The child dies with the parent (a SIGKILLed launch leaves no compile running)."""
    with contextlib.suppress(OSError, AttributeError):  # PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _child(work: Callable[[], bytes], w: int, debug: bool, close: tuple[int, ...]) -> int:
    for fd in close:
        with contextlib.suppress(OSError):
            os.close(fd)
    try:
        data = work()
    except GovernorError as err:
        return report(err, debug=debug)
    except KeyboardInterrupt:
        return 130  # the parent got the same ^C and says so
    except BaseException:  # a bug: shown with its traceback, never silent
        import traceback  # lazy: a crash of the compile child only

        traceback.print_exc()
        return EXIT_CRASH
    view = memoryview(data)
    while view:
        view = view[os.write(w, view) :]
    return 0


def run_isolated(work: Callable[[], bytes], *, debug: bool, close: tuple[int, ...] = ()) -> bytes:
    """``work()`` in a forked child; its bytes, or :class:`Reported` with the child's exit code
    (the child printed the error). ``close``: fds the child must not hold (the watchdog's pipe)."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 1
        try:
            os.close(r)
            _prctl_pdeathsig()
            code = _child(work, w, debug, close)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(code)
    os.close(w)
    chunks = []
    try:
        with os.fdopen(r, "rb") as f:
            while chunk := f.read(1 << 16):
                chunks.append(chunk)
    finally:
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code > 0:
        raise Reported(code)
    if code < 0:
        raise LaunchError(
            f"the plan compile died of {signal.Signals(-code).name}"
            f" (pid {pid}, the compile child of governor launch)",
            exit_code=128 - code,
            hint="out of memory? `governor check POLICY --engine-argv '...'` compiles the same",
        )
    return b"".join(chunks)
