"""Start the engine inside the plan's leaf cgroup and supervise it.

The child is born in the leaf (clone3 with CLONE_INTO_CGROUP, governor/kernel/clone.py) or,
where the kernel cannot do that, forks and writes itself into the leaf's cgroup.procs FIRST, so
every page it touches is charged to the slice. Then it sets RLIMIT_MEMLOCK, CPU affinity, nice
and oom_score_adj, drops privileges (initgroups, setgid, setuid) and execs the engine without a
shell. A close-on-exec pipe tells the parent whether the exec happened or which step failed
and why. The model is prefetched by a helper in the same leaf, concurrently with the engine's
start (governor/launch/prefetch.py), never before it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno as errno_mod
import json
import os
import resource
import selectors
import signal
import time
from collections.abc import Callable
from typing import Any, Protocol

from governor.errors import BackendError, GovernorError, LaunchError, PermissionDenied
from governor.kernel import clone
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.launch.forward import FORWARDED_SIGNALS, Forwarder
from governor.launch.hygiene import exec_hygiene
from governor.log import get_logger
from governor.monitor.restart import Request, Restarts
from governor.plan.model import Plan
from governor.record import asdict, field, record

log = get_logger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# exit status of a child that failed before exec (the parent maps the real cause from the pipe)
_CHILD_FAILED = 122
# the child's first write on the report pipe: it ran. A child the kernel killed as it was born
# closes the pipe without it (see Launcher.start)
_RAN = b"+"
BACKOFF_TICK_S = 0.1  # a restart's backoff checks this often whether the operator said stop
RESTART_EMPTY_TIMEOUT_S = 10.0  # how long a relaunch waits for the killed run to be gone


@record
class LaunchReport:
    """What ``--report FILE`` holds (JSON), and what the summary log line carries."""

    policy: str
    cgroup: str
    argv: list[str]
    pid: int
    exit_code: int  # what governor exits with: the engine's status or 128+N
    signal: int | None  # the signal that killed the engine, if one did
    signal_name: str | None
    memory_peak: int | None  # bytes (memory.peak; None without the memory controller / < 5.19)
    oom_kill: int | None  # memory.events of the group
    oom_group_kill: int | None
    memory_events_max: int | None
    memory_events_high: int | None
    cpu_usage_usec: int | None
    wall_seconds: float
    degraded: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # [prefetch] (None when mode = "none"): see governor/launch/prefetch.py
    prefetch_bytes: int | None = None
    prefetch_seconds: float | None = None
    resident_fraction: float | None = None
    prefetch_method: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


@record(frozen=True)
class ChildSetup:
    """Everything the child does between fork and exec, resolved in the parent."""

    executable: str  # resolved path of argv[0]
    argv: tuple[str, ...]  # passed to exec unchanged
    env: dict[str, str]
    uid: int | None = None
    gid: int | None = None
    user: str | None = None
    home: str | None = None
    pdeathsig: bool = True  # on_governor_exit = "kill"


class Launcher:
    """Fork, join, set up, exec; then supervise: forward signals, wait, collect the summary."""

    def __init__(
        self,
        fs: CgroupFs,
        *,
        proc: ProcFs | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        clone_into_cgroup: bool = True,
    ) -> None:
        self.fs = fs
        self.proc = proc or ProcFs()
        self.clone_into_cgroup = clone_into_cgroup
        self.clock = clock
        self.sleep = sleep

    # --- child -------------------------------------------------------------------------------

    def _child(self, plan: Plan, setup: ChildSetup, report_fd: int, *, joined: bool) -> None:
        """Runs in the forked child; never returns."""
        step = "join"
        try:
            os.write(report_fd, _RAN)
            for sig in FORWARDED_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            if not joined:
                self.fs.move(os.getpid(), plan.leaf)
            spec = plan.launch
            if spec.memlock is not None:
                step = "memlock"
                if spec.memlock == "model":  # the api resolves it; reaching here is a bug
                    raise ValueError("memlock = model was not resolved")
                limit = resource.RLIM_INFINITY if spec.memlock == -1 else spec.memlock
                resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))
            if spec.affinity:
                step = "affinity"
                os.sched_setaffinity(0, spec.affinity)
            if spec.nice is not None:
                step = "nice"
                os.setpriority(os.PRIO_PROCESS, 0, spec.nice)
            if spec.oom_score_adj is not None:
                step = "oom_score_adj"
                self.proc.write_oom_score_adj(spec.oom_score_adj)
            if setup.uid is not None or setup.gid is not None:
                step = "user"
                if setup.gid is not None:
                    if setup.user is not None:
                        os.initgroups(setup.user, setup.gid)
                    else:
                        os.setgroups([setup.gid])
                    os.setgid(setup.gid)
                if setup.uid is not None:
                    os.setuid(setup.uid)
            if setup.pdeathsig:
                # after setuid: changing credentials clears the parent-death signal (prctl(2))
                step = "pdeathsig"
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
            step = "exec"
            exec_hygiene(report_fd)
            os.execve(setup.executable, setup.argv, setup.env)
        except BaseException as err:
            code = getattr(err, "errno", None) or 0
            try:
                os.write(report_fd, f"{step}\0{code}\0{err}".encode(errors="replace"))
            finally:
                os._exit(_CHILD_FAILED)

    # --- parent ------------------------------------------------------------------------------

    def start(self, plan: Plan, setup: ChildSetup) -> int:
        """Fork the engine; return its pid once it has exec'd, or raise why it could not.

        A child born in the leaf (CLONE_INTO_CGROUP) that never ran was killed by the kernel
        as it was born: 6.18's cgroup_css_set_fork saves the kill_seq of the *parent's* cgroup
        before it takes the CLONE_INTO_CGROUP target, and cgroup_post_fork SIGKILLs the child
        when the target's differs, as it does in any leaf a `cgroup.kill` reached (the
        `restart` action's, the watchdog's). Then this launcher forks and joins by hand from
        here on (the fork path compares the parent's cgroup with itself)."""
        pid, joined, report = self._spawn_child(plan, setup)
        if joined and not report:
            _, status = os.waitpid(pid, 0)
            log.warning(
                "launch.killed_at_birth",
                cgroup=plan.leaf,
                signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                detail="the kernel killed the engine born in its leaf (CLONE_INTO_CGROUP after"
                " a cgroup.kill there, Linux 6.18's kill_seq); forking and joining instead",
            )
            self.clone_into_cgroup = False
            pid, joined, report = self._spawn_child(plan, setup)
        if report in (b"", _RAN):  # exec'd (or died unseen before: its wait says how)
            log.info("engine.started", pid=pid, cgroup=plan.leaf, argv=list(setup.argv))
            return pid
        os.waitpid(pid, 0)
        step, code, message = report.removeprefix(_RAN).decode(errors="replace").split("\0", 2)
        raise _child_error(step, int(code), message, plan, setup)

    def _spawn_child(self, plan: Plan, setup: ChildSetup) -> tuple[int, bool, bytes]:
        """(pid, born in the leaf, what the child wrote on the report pipe until exec)."""
        r, w = os.pipe2(os.O_CLOEXEC)
        pid, joined = self.spawn(plan.leaf)
        if pid == 0:  # pragma: no cover - runs in the child, observed through its effects
            os.close(r)
            self._child(plan, setup, w, joined=joined)
        os.close(w)
        chunks = []
        while chunk := os.read(r, 4096):
            chunks.append(chunk)
        os.close(r)
        return pid, joined, b"".join(chunks)

    def spawn(self, leaf: str) -> tuple[int, bool]:
        """(pid, born in the leaf): clone3 into the leaf where the kernel can, else fork."""
        if self.clone_into_cgroup:
            try:
                dirfd = self.fs.open_dir(leaf)
            except GovernorError:
                dirfd = None  # the child's cgroup.procs write reports the real error
            if dirfd is not None:
                born: tuple[int, int] | None = None
                try:
                    born = clone.clone_into(dirfd)
                finally:
                    if born is None or born[0] != 0:
                        os.close(dirfd)
                if born is not None:
                    pid, pidfd = born
                    if pid != 0:
                        os.close(pidfd)
                    return pid, True
        return os.fork(), False

    def supervise(
        self,
        plan: Plan,
        pid: int,
        *,
        started: float,
        on_tick: Callable[[], None] | None = None,
        tick_s: float | None = None,
        watcher: Watcher | None = None,
    ) -> tuple[int, int | None]:
        """Forward signals to the engine and wait for it. Returns (exit code, signal).

        With a ``watcher`` (the pressure monitor) the wait is the watcher's: it polls the
        engine's pidfd together with its own sources."""
        fwd = Forwarder()
        with fwd.installed():
            fwd.engine(pid)
            return self._wait(pid, on_tick=on_tick, tick_s=tick_s, watcher=watcher)

    def supervise_restarting(
        self,
        plan: Plan,
        setup: ChildSetup,
        pid: int,
        *,
        watcher: EngineWatcher,
        restarts: Restarts,
        on_restart: Callable[[int], None] | None = None,
        forwarder: Forwarder | None = None,
    ) -> tuple[int, int, int | None]:
        """:meth:`supervise`, and relaunch the engine in the same leaf while the monitor's
        ``restart`` action asks for it (governor/monitor/restart.py). Returns (pid of the last
        engine, its exit code, its signal). The leaf and its limits stay in place between runs;
        a terminating signal from the operator ends the loop (never answered by a relaunch).
        ``forwarder``: one the caller installed already (holding what came before the engine
        ran); else one is installed for the loop."""
        fwd = forwarder if forwarder is not None else Forwarder()
        fwd.on_signal = restarts.on_signal
        with contextlib.nullcontext(fwd) if forwarder is not None else fwd.installed():
            while True:
                fwd.engine(pid)
                code, sig = self._wait(pid, watcher=watcher)
                fwd.engine(None)
                watcher.engine_exited()
                req = restarts.take()
                if req is None:
                    return pid, code, sig
                new_pid = self._relaunch(plan, setup, req, restarts, pid=pid, code=code, sig=sig)
                if new_pid is None:
                    return pid, code, sig
                pid = new_pid
                watcher.engine_started(pid)
                if on_restart is not None:
                    on_restart(pid)

    def _relaunch(
        self,
        plan: Plan,
        setup: ChildSetup,
        req: Request,
        restarts: Restarts,
        *,
        pid: int,
        code: int,
        sig: int | None,
    ) -> int | None:
        """Wait the backoff and start the engine again; None when stopped or it failed."""
        signal_name = signal.Signals(sig).name if sig else None
        log.warning(
            "engine.restart",
            attempt=req.attempt,
            limit=restarts.limit,
            backoff_s=req.backoff_s,
            rule=req.rule,
            when=req.when,
            previous_pid=pid,
            exit_code=code,
            signal=signal_name,
        )
        entry = restarts.record(req, exit_code=code, sig=sig)
        if not self._backoff(req.backoff_s, stop=lambda: restarts.stopped_by is not None):
            entry["cancelled"] = restarts.stopped_by
            log.info("engine.restart_cancelled", attempt=req.attempt, reason=restarts.stopped_by)
            return None
        if not self._wait_group_empty(plan.group):
            entry["error"] = "the previous run's processes did not exit"
            return None
        try:
            return self.start(plan, setup)
        except GovernorError as err:
            # the engine ran before, so this is new (binary replaced, user gone): say why and
            # end with the last run's status, cleaning up as without restart
            entry["error"] = str(err)
            log.error("engine.restart_failed", attempt=req.attempt, error=str(err))
            return None

    def _wait_group_empty(self, group: str) -> bool:
        """The killed run's other processes (the engine's children, a locker) must be gone
        before the next run joins: they still hold memory charged to the same budget. False
        when they are still there after RESTART_EMPTY_TIMEOUT_S: no relaunch on top of them."""
        deadline = self.clock() + RESTART_EMPTY_TIMEOUT_S
        while True:
            try:
                populated = self.fs.events(group).get("populated", 0)
            except GovernorError:
                return True  # no cgroup.events to ask (test trees): nothing to wait for
            if not populated:
                return True
            if self.clock() >= deadline:
                log.error(
                    "engine.restart_group_busy",
                    cgroup=group,
                    waited_s=RESTART_EMPTY_TIMEOUT_S,
                    detail="processes of the previous run are still in the group (D state?);"
                    " not relaunching on top of them",
                )
                return False
            self.sleep(BACKOFF_TICK_S)

    def _backoff(self, seconds: float, *, stop: Callable[[], bool]) -> bool:
        """Wait ``seconds``; False as soon as ``stop()`` (a signal handler set it)."""
        deadline = self.clock() + seconds
        while not stop():
            left = deadline - self.clock()
            if left <= 0:
                return True
            self.sleep(min(left, BACKOFF_TICK_S))
        return False

    def _wait(
        self,
        pid: int,
        *,
        on_tick: Callable[[], None] | None = None,
        tick_s: float | None = None,
        watcher: Watcher | None = None,
    ) -> tuple[int, int | None]:
        pidfd = os.pidfd_open(pid)
        try:
            if watcher is not None:
                while not watcher.wait(pidfd, tick_s):
                    if on_tick is not None:
                        on_tick()
            else:
                with selectors.DefaultSelector() as sel:
                    sel.register(pidfd, selectors.EVENT_READ)
                    while not sel.select(tick_s):
                        if on_tick is not None:
                            on_tick()
        finally:
            os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            died_of = os.WTERMSIG(status)
            return 128 + died_of, died_of
        return os.WEXITSTATUS(status), None

    def summarize(
        self,
        plan: Plan,
        *,
        pid: int,
        argv: tuple[str, ...],
        code: int,
        sig: int | None,
        wall: float,
    ) -> LaunchReport:
        """Read the group's counters after the engine exited (before the group is removed)."""
        mem_events = self._try(lambda: self.fs.memory_events(plan.group))
        cpu = self._try(lambda: self.fs.cpu_stat(plan.group))
        peak_text = self._try(lambda: self.fs.read(plan.group, kf.MEMORY_PEAK))
        return LaunchReport(
            policy=plan.policy,
            cgroup=f"{plan.cgroup_root}/{plan.leaf}",
            argv=list(argv),
            pid=pid,
            exit_code=code,
            signal=sig,
            signal_name=signal.Signals(sig).name if sig else None,
            memory_peak=int(peak_text) if peak_text else None,
            oom_kill=mem_events.get("oom_kill") if mem_events else None,
            oom_group_kill=mem_events.get("oom_group_kill") if mem_events else None,
            memory_events_max=mem_events.get("max") if mem_events else None,
            memory_events_high=mem_events.get("high") if mem_events else None,
            cpu_usage_usec=cpu.get("usage_usec") if cpu else None,
            wall_seconds=round(wall, 3),
            degraded=list(plan.degraded),
        )

    @staticmethod
    def _try(read: Callable[[], Any]) -> Any:
        try:
            return read()
        except GovernorError:
            return None


class Watcher(Protocol):
    """Waits for the engine's pidfd together with its own sources (governor/monitor/loop.py).

    The watcher owns the wait because PSI trigger events are consumed by the poll that sees
    them (psi_trigger_poll resets the event): an epoll nested in another would lose them."""

    def wait(self, exit_fd: int, limit_s: float | None) -> bool:
        """Handle what is ready within ``limit_s``; True once ``exit_fd`` is readable."""
        ...


class EngineWatcher(Watcher, Protocol):
    """A watcher that follows the engine across relaunches (the pressure monitor)."""

    def engine_exited(self) -> None:
        """The engine exited: last look (its rules may still ask for a restart)."""
        ...

    def engine_started(self, pid: int) -> None:
        """The engine was started again as ``pid``."""
        ...


def _child_error(
    step: str, code: int, message: str, plan: Plan, setup: ChildSetup
) -> GovernorError:
    name = errno_mod.errorcode.get(code, str(code))
    if step == "exec":
        if code in (errno_mod.ENOENT, errno_mod.ENOTDIR):
            return LaunchError(
                f"engine not found: {setup.argv[0]} (-- ENGINE, exec: {name})",
                exit_code=127,
                hint="check the path after --; relative paths are resolved from the current directory",
            )
        return LaunchError(
            f"engine cannot be executed: {setup.argv[0]} (-- ENGINE, exec: {name}: {os.strerror(code) if code else message})",
            exit_code=126,
            hint=f"chmod +x {setup.executable}, and check the user the policy runs it as",
        )
    if step == "join":
        return BackendError(
            f"engine could not join its cgroup: {message}", cgroup=plan.leaf, file=kf.CGROUP_PROCS
        )
    hints = {
        "memlock": "raising RLIMIT_MEMLOCK above the hard limit needs CAP_SYS_RESOURCE"
        " (run as root with that capability, or lower process.memlock)",
        "oom_score_adj": "lowering oom_score_adj needs CAP_SYS_RESOURCE",
        "nice": "a negative nice needs CAP_SYS_NICE",
        "user": "dropping to process.user needs root (CAP_SETUID/CAP_SETGID)",
        "affinity": "the CPUs must be online and allowed by the cpuset",
        "prefetch": "reading or locking the prefetch files failed; mlock needs CAP_IPC_LOCK or"
        " RLIMIT_MEMLOCK above the files' size (or use prefetch.mode = populate)",
    }
    cls = PermissionDenied if code in (errno_mod.EPERM, errno_mod.EACCES) else BackendError
    return cls(
        f"engine setup failed at {step}: {message}", errno=code or None, hint=hints.get(step)
    )
