"""One exception hierarchy; every class carries its exit code (design.md, "Errors and exit codes").

Messages are built from fields (cgroup, file, value, errno; or policy file and field path) so
that the coordinates are never lost. The CLI prints ``governor: <message>`` and ``hint: <hint>``.
"""

from __future__ import annotations

import errno as errno_mod
import os
import sys

EXIT_USAGE = 2
EXIT_POLICY = 65  # EX_DATAERR
EXIT_NOINPUT = 66  # EX_NOINPUT
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE
EXIT_OSERR = 71  # EX_OSERR
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL: the board cannot take the engine now (issue 36)
EXIT_NOPERM = 77  # EX_NOPERM
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class GovernorError(Exception):
    """Base of every expected failure. ``str()`` is the one-line message."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return one_line(self.message)


MESSAGE_MAX = 4000  # characters of one error line: every problem listed, but a 1 MB key is cut


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (a 1 MB string or a
    400-digit number is not echoed back in full)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str, limit: int = MESSAGE_MAX) -> str:
    """``text`` as exactly one terminal line: control characters (a newline in a file name) as
    visible escapes, and cut to ``limit`` characters."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


POLICY_HINT = "`governor schema` lists every key and its syntax; policies/*.toml are examples"
HOST_HINT = "`governor doctor` says what this host supports and how to fix what is missing"


def report(err: BaseException, *, debug: bool) -> int:
    """The one error printer of both command lines (governor/main.py, governor/cli/app.py):
    ``governor: <message>`` and ``hint: ...`` on stderr, the traceback too with --debug; returns
    the error's exit code."""

    sys.stderr.write(f"governor: {one_line(str(err))}\n")
    hint = getattr(err, "hint", None)
    if hint:
        sys.stderr.write(f"hint: {one_line(hint)}\n")
    if debug:
        import traceback

        traceback.print_exception(err)
    code = getattr(err, "exit_code", 1)
    return code if isinstance(code, int) else 1


class Reported(Exception):  # not an error to print: one that was printed
    """An error a short-lived compile process (governor/api/isolate.py) already printed in the
    usual form: the command exits with its code and says nothing more."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGTERM, SIGHUP, SIGQUIT, SIGINT) while the governor was applying limits:
    everything applied was rolled back; exit 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum


class UsageError(GovernorError):
    exit_code = EXIT_USAGE


class PolicyError(GovernorError):
    """A policy that does not parse or validate; carries the file and the field path."""

    exit_code = EXIT_POLICY

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = ", ".join(p for p in (file, field) if p)
        super().__init__(f"{message} ({where})" if where else message, hint=hint or POLICY_HINT)
        self.reason = message
        self.file = file
        self.field = field


class PolicyNotFound(PolicyError):
    exit_code = EXIT_NOINPUT


class HostError(GovernorError):
    """The host cannot do what was asked: no cgroup2, controller missing, CPUs offline..."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(
        self, message: str, *, hint: str | None = None, missing: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, hint=hint or HOST_HINT)
        self.missing = missing


class _OsFailure(GovernorError):
    """A failed kernel/file operation with its coordinates."""

    def __init__(
        self,
        action: str,
        *,
        cgroup: str | None = None,
        file: str | None = None,
        value: str | None = None,
        errno: int | None = None,
        hint: str | None = None,
    ) -> None:
        parts = []
        if cgroup is not None:
            parts.append(f"cgroup {cgroup}")
        if file is not None:
            parts.append(f"file {file}")
        if value is not None:
            parts.append(f"value {value!r}")
        if errno is not None:
            name = errno_mod.errorcode.get(errno, str(errno))
            parts.append(f"{name}: {os.strerror(errno)}")
        where = f" ({', '.join(parts)})" if parts else ""
        super().__init__(f"{action}{where}", hint=hint)
        self.action = action
        self.cgroup = cgroup
        self.file = file
        self.value = value
        self.errno = errno


class BackendError(_OsFailure):
    exit_code = EXIT_OSERR


class PermissionDenied(_OsFailure):
    exit_code = EXIT_NOPERM


class AdmissionRefused(GovernorError):
    """The board's budget cannot take this slice now (governor/board/budget.py): its
    guarantees do not fit beside the others', or its peak does not and ``[qos] admit`` says
    refuse (or a wait ran out). Nothing was applied."""

    exit_code = EXIT_TEMPFAIL


class LaunchError(GovernorError):
    """The engine could not be started (127 not found, 126 not executable)."""

    def __init__(self, message: str, *, exit_code: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code
