"""The prefetch helper: reads (or locks) the model in the engine's leaf WHILE the engine starts.

Wave 1 prefetched in the engine's child before exec, so the engine waited for the whole file
(~0.5 s per GiB here) even when its own page faults would have found most of it cached. Now the
engine is exec'd at once and this helper, born in the same leaf (clone3 CLONE_INTO_CGROUP, or
fork + cgroup.procs), reads the files concurrently: the page cache is charged to the slice
(first touch), the engine's faults find pages the helper brought in, and the readers together
keep the disk busy from the first millisecond.

``lock`` keeps its guarantees: the helper populates, mlock()s every file and then stays alive,
holding the lock, until the engine exits (it polls a pidfd of the engine), in its own session
(a ^C at the terminal is for the engine), in the leaf (cgroup.kill of the group kills it). If
the lock fails (EPERM without CAP_IPC_LOCK, ENOMEM above RLIMIT_MEMLOCK) the policy's promise
cannot be kept: the helper kills the group (fail closed) and the supervisor exits with the
error's code instead of the engine's status.

The result travels back through a shared anonymous mapping made before the fork: no file to
leak, nothing the engine inherits.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import select
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.kill import kill_tree
from governor.launch.prefetch import Mode, Prefetcher, PrefetchResult, _Libc
from governor.log import get_logger
from governor.record import asdict, field, record

log = get_logger(__name__)

RESULT_BYTES = 64 << 10
LOCK_EXIT_GRACE_S = 2.0  # how long finish() lets a locker leave on its own
_SESSION_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@record
class PrefetchHelper:
    """One helper for one engine start. ``spawn`` creates a child in the leaf and returns
    (pid, born in the leaf); ``join`` moves the calling process into the leaf (fallback);
    ``kill_group`` kills the policy's group from inside it (:func:`kill_own_group`)."""

    files: tuple[str, ...]
    mode: Mode
    pid: int | None = None
    _shared: mmap.mmap = field(init=False, repr=False)
    # the helper is reaped the moment it exits (a populate helper ends long before a server
    # does: it must not stay a zombie for the engine's whole life), by a thread blocked in
    # waitid() on a pidfd: a SIGKILL through the pidfd can never reach a reused pid
    _pidfd: int | None = field(default=None, init=False, repr=False)
    _reaper: threading.Thread | None = field(default=None, init=False, repr=False)
    _reaped: threading.Event = field(default_factory=threading.Event, init=False, repr=False)

    def __post_init__(self) -> None:
        self._shared = mmap.mmap(-1, RESULT_BYTES)  # MAP_SHARED | MAP_ANONYMOUS

    def start(
        self,
        engine_pid: int,
        *,
        spawn: Callable[[], tuple[int, bool]],
        join: Callable[[], None],
        kill_group: Callable[[], object],
    ) -> None:
        self._shared[:] = b"\0" * RESULT_BYTES
        pid, joined = spawn()
        if pid == 0:  # pragma: no cover - the helper; observed through the slice's memory.stat
            code = 0
            try:
                if not joined:
                    join()
                code = self._run(engine_pid, kill_group)
            except BaseException as err:
                self._publish({"error": f"{type(err).__name__}: {err}"})
                code = 1
            finally:
                os._exit(code)
        self.pid = pid
        self._pidfd = os.pidfd_open(pid)  # a zombie still has one: only we reap it
        self._reaped.clear()
        self._reaper = threading.Thread(
            target=self._reap, args=(self._pidfd,), name="prefetch-reaper", daemon=True
        )
        self._reaper.start()
        log.info("prefetch.started", pid=pid, mode=self.mode, files=list(self.files))

    def _reap(self, pidfd: int) -> None:
        try:
            done = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        except ChildProcessError:
            done = None  # reaped elsewhere: gone all the same
        self._reaped.set()
        if done is not None:
            log.info("prefetch.exited", pid=done.si_pid, status=done.si_status)

    def _run(self, engine_pid: int, kill_group: Callable[[], object]) -> int:
        os.setsid()
        for sig in _SESSION_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        pidfd = os.pidfd_open(engine_pid)
        _close_fds_except({2, pidfd})
        paths = [Path(f) for f in self.files]
        res = Prefetcher().run(paths, self.mode, tty=None)
        if self.mode == "lock":
            try:
                res.locked_bytes = _lock(paths)
                res.locker_pid = os.getpid()
            except OSError as err:
                res.error = f"mlock: {os.strerror(err.errno or 0)} ({err})"
                self._publish(asdict(res) | {"errno": err.errno})
                log.error("prefetch.lock_failed", error=res.error, action="kill the group")
                kill_group()
                return 1
        self._publish(asdict(res))
        log.info(
            "prefetch.done",
            mode=res.mode,
            method=res.method,
            bytes=res.bytes,
            seconds=res.seconds,
            resident_fraction=res.resident_fraction,
            topup_rounds=res.topup_rounds,
            locked_bytes=res.locked_bytes,
        )
        if self.mode == "lock":
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 2)
            os.close(devnull)
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while not poller.poll():
                pass
        return 0

    def _publish(self, data: dict[str, object]) -> None:
        raw = json.dumps(data).encode()
        if len(raw) >= RESULT_BYTES:
            files = data.get("files")
            if isinstance(files, list):
                data = data | {"files": [*files[:1], f"... {len(files) - 1} more"]}
            raw = json.dumps(data).encode()[: RESULT_BYTES - 1]
        self._shared[: len(raw)] = raw

    def result(self) -> tuple[PrefetchResult | None, int | None]:
        """(the published result, the lock's errno when the lock failed)."""
        raw = self._shared[:].split(b"\0", 1)[0]
        if not raw:
            return None, None
        try:
            data = json.loads(raw)
        except ValueError:
            return None, None
        lock_errno = data.pop("errno", None)
        if "mode" not in data:  # the helper failed before it had a result
            log.warning("prefetch.failed", error=data.get("error"))
            return None, None
        try:
            return PrefetchResult(**data), lock_errno
        except TypeError:
            return None, None

    def finish(self) -> tuple[PrefetchResult | None, int | None]:
        """After the engine exited: stop a helper still reading (nobody needs the pages now),
        reap it, and return :meth:`result`."""
        if self.pid is not None and self._pidfd is not None and self._reaper is not None:
            # a locker leaves by itself once the engine is gone (its pidfd): give it a moment
            # to finish publishing; a reader still reading is stopped at once
            grace = LOCK_EXIT_GRACE_S if self.mode == "lock" else 0.0
            if not self._reaped.wait(grace):
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            self._reaper.join()
            os.close(self._pidfd)
            self._pidfd = self._reaper = None
            self.pid = None
        return self.result()

    @property
    def reaped(self) -> bool:
        """Whether the helper has exited and been reaped (False before start)."""
        return self._reaped.is_set()


def kill_own_group(
    fs: CgroupFs, group: str, kill: Callable[[int, int], None] = os.kill
) -> str | None:
    """The helper's fail-closed kill of its own group: cgroup.kill, or on a kernel without it
    (5.10 boards) SIGKILL to each pid but the helper's, round after round, the group left
    unfrozen (governor/kernel/kill.py: a freeze would stop the helper itself)."""
    how = kill_tree(fs, group, kill, inside=os.getpid())
    if how is not None:
        log.warning("prefetch.killed_group", cgroup=group, how=how)
    return how


def _lock(paths: Sequence[Path]) -> int:
    """mmap + mlock every file; the mappings stay until this process exits."""
    libc = _Libc()
    locked = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size:
                libc.lock(libc.map(fd, 0, size), size)
                locked += size
        finally:
            os.close(fd)
    return locked


def _close_fds_except(keep: set[int]) -> None:
    """The helper holds nothing of the governor's: not the group's lock, not the watchdog's
    pipe, not the PSI trigger fds (0 and 1 go to /dev/null)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1):
        os.dup2(devnull, std)
    keep = keep | {0, 1, devnull}
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    os.close(devnull)
