"""What the engine inherits across the launcher's exec (governor/launch/launcher.py
_exec_hygiene): no file descriptor beyond 0-2, default signal dispositions (Python ignores
SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec) and an empty mask.

Needs: a tmp directory, fork/exec, /bin/cat and /bin/ls (the engine is the real program reading
its own /proc entries).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.backends.cgroupfs import CgroupfsBackend
from governor.launch.launcher import ChildSetup, Launcher

from .fakekernel import FakeKernelCgroupFs
from .plans import make_plan

LEAKED_FD = 57


def _run(fake_fs: FakeKernelCgroupFs, argv: tuple[str, ...], out: Path) -> None:
    plan = make_plan()
    CgroupfsBackend(fake_fs).apply(plan)
    setup = ChildSetup(executable=argv[0], argv=argv, env=dict(os.environ), pdeathsig=False)
    with open(out, "wb") as f:
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)  # the engine's stdout is the governor's fd 1
        try:
            pid = Launcher(fake_fs).start(plan, setup)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.fixture
def secret(tmp_path: Path) -> Iterator[Path]:
    """An inheritable fd 57 on a file, as a shell's `57<secret` would leave it."""
    path = tmp_path / "secret"
    path.write_text("root only\n")
    fd = os.open(path, os.O_RDONLY)
    os.dup2(fd, LEAKED_FD, inheritable=True)
    os.close(fd)
    try:
        yield path
    finally:
        os.close(LEAKED_FD)


def test_the_engine_inherits_no_descriptor_beyond_stdio(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path, secret: Path
) -> None:
    out = tmp_path / "fds"
    _run(fake_fs, ("/bin/ls", "-l", "/proc/self/fd/"), out)
    listing = out.read_text()
    assert str(secret) not in listing
    fds = sorted(
        int(line.split(" -> ")[0].split()[-1]) for line in listing.splitlines() if " -> " in line
    )
    # 0-2 and the directory ls itself opened to list /proc/self/fd
    assert fds[:3] == [0, 1, 2]
    assert len(fds) <= 4, listing


def _mask(status: str, key: str) -> int:
    for line in status.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"{key} missing")


def test_the_engine_starts_with_default_signals_and_an_empty_mask(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    # the governor's own state: Python ignores SIGPIPE and SIGXFSZ; block one signal too
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
    old_usr2 = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    out = tmp_path / "status"
    try:
        _run(fake_fs, ("/bin/cat", "/proc/self/status"), out)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        signal.signal(signal.SIGUSR2, old_usr2)
    status = out.read_text()
    assert _mask(status, "SigIgn") == 0, "the engine starts with signals ignored"
    assert _mask(status, "SigBlk") == 0, "the engine starts with signals blocked"
