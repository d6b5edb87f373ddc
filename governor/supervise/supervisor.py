"""The supervisor of one engine run: lock -> apply -> watchdog -> start -> notify -> prefetch
alongside -> monitor -> supervise -> report -> remove.

Run time only (tests/runtime/test_main.py): never pydantic, typer or structlog. Everything it
needs was resolved before (api/launch.py: the plan, the child's setup, the prefetch files): a
:class:`Job`.

Cleanup is unconditional: whatever fails after the apply (the start, the monitor, the report),
the group is removed (unless ``keep``) before the watchdog is disarmed, so neither a traceback
nor SIGKILL leaves a cgroup behind. The PSI trigger fds are closed after the report is written
and side by side (governor/monitor/psi.py close_triggers), off the engine's exit path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from governor.backends.device import board_baseline
from governor.errors import BackendError, GovernorError, PermissionDenied
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.launch.forward import Forwarder, interruptible
from governor.launch.helper import PrefetchHelper, kill_own_group
from governor.launch.launcher import ChildSetup, Launcher, LaunchReport
from governor.log import get_logger
from governor.monitor.actions.base import Env
from governor.monitor.loop import Monitor
from governor.monitor.restart import Restarts
from governor.monitor.sources import Board
from governor.plan.model import Plan
from governor.record import field, record
from governor.rundir.journal import Journal
from governor.rundir.liveness import own_start
from governor.rundir.state import Publisher, RunState, applied, run_dir
from governor.supervise.learn import learn_peak
from governor.supervise.sdnotify import notify
from governor.supervise.watchdog import Watchdog

if TYPE_CHECKING:
    from types import ModuleType

    from governor.backends.clocks import BoardClocks
    from governor.supervise.generate import GenerateProbe
    from governor.supervise.models import ModelLeaves
    from governor.supervise.ready import ReadyWait

log = get_logger("governor.launch")
# the estimate's keys a published state carries (the learned peak: state/peaks.py)
MODEL_KEYS = ("model", "quant", "total", "router", "measured", "measured_runs")


class Backend(Protocol):
    fs: CgroupFs

    def lock(self, plan: Plan) -> contextlib.AbstractContextManager[list[str]]: ...
    def apply(self, plan: Plan) -> Any: ...
    def remove(self, plan: Plan, *, owned: Collection[str] | None = None) -> Any: ...


@record(frozen=True)
class Job:
    """One launch, resolved: what to apply, what to exec, what to prefetch, where to report."""

    plan: Plan  # the plan the backend applies (the delegated part under systemd)
    setup: ChildSetup
    prefetch_files: tuple[str, ...] = ()
    report: Path | None = None
    keep: bool = False
    sample_s: float = 1.0
    psi_triggers: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # into the report (the estimate)
    backend: str = "cgroupfs"  # for the published state
    policy_sha256: str | None = None  # of the policy file, for the published state
    run_dir: Path | None = (
        None  # where the state is published (default governor.rundir.state.run_dir)
    )
    model_bytes: int | None = None  # the engine's model files (tune recompiles "model" sizes)
    systemd: dict[str, Any] | None = None  # the unit carrying the limits (backends/manager.py)
    # the engine is ready when this URL answers 200 (READY=1 then, not at exec); None = at exec
    ready_url: str | None = None
    ready_timeout_s: float = 300.0
    sysfs_root: str = "/sys"  # [clocks]: every clock file written resolves under it
    # the board lock admission took (governor/api/admit.py): released once the state is
    # published, so a racing launch reads this slice's claim; the admission's note is journaled
    board_release: Callable[[], None] | None = None
    admit_note: str | None = None
    # llama-server's router: alias -> ModelLimits of each model's leaf (supervise/models.py),
    # its http://HOST:PORT (published as RunState.router's url)
    model_leaves: dict[str, Any] | None = None
    router_url: str | None = None
    slot_save: bool = False  # --slot-save-path: evicted slots kept (supervise/slots.py)
    # where the board is read from (/proc/meminfo, manifests): "/" but in tests; the evictor's
    # free budget for this slice with evict = "memory" (board/scan.py free_for)
    board_root: Path = Path("/")


class Supervisor:
    def __init__(
        self,
        backend: Backend,
        launcher: Launcher,
        *,
        proc: ProcFs,
        watchdog: Watchdog | None,
        clock: Callable[[], float] = time.monotonic,
        clocks: BoardClocks | None = None,
    ) -> None:
        self.backend = backend
        self.clocks = clocks  # [clocks]: default, the ledger in the job's run directory
        self.launcher = launcher
        self.proc = proc
        self.watchdog = watchdog
        self.clock = clock
        self.helper: PrefetchHelper | None = None
        self.publisher: Publisher | None = None
        self.monitor: Monitor | None = None
        self.restarts: Restarts | None = None
        self.engine_pid: int | None = None
        self.started_at = 0.0
        self.board: dict[str, int] | None = None  # the unaccounted memory's baseline
        self.state: RunState | None = None  # the last published state (served metrics)
        # readiness (job.ready_url): None = ready at exec, False = loading, True = answered 200
        self.ready: bool | None = None
        self.ready_wait: ReadyWait | None = None
        self.probe: GenerateProbe | None = None  # [engine] probe_generate, once ready
        self.not_ready: str | None = None  # why the engine was stopped as never ready
        self.unresponsive = False  # not_ready says why the one-token probe stopped it
        self.forwarder: Forwarder | None = None  # installed from the apply's end (run())
        self.leaves: ModelLeaves | None = None  # llama-server's router: its models' leaves

    def run(self, job: Job) -> int:
        """Returns the engine's status (128+N when it died of signal N)."""
        plan = job.plan
        try:
            # from the end of the apply until the engine runs a stop signal is held, then
            # forwarded to the engine (launch/forward.py Forwarder), never the default action
            self.forwarder = Forwarder(hold=True)
            with self.backend.lock(plan) as locked, self.forwarder.installed():
                # a stop signal while the limits are written (a memory.max write can block in
                # reclaim) rolls the apply back, as ^C does, until the watchdog is armed
                owned: set[str] = set(locked)
                with interruptible():
                    # the board's clocks first: a conflict with another policy refuses (65)
                    # before anything is applied
                    clocks = self._take_clocks(job)
                    try:
                        applied = self.backend.apply(plan)
                    except BaseException:
                        self._give_clocks(job, clocks)
                        raise
                    owned.update(getattr(applied, "created", ()))
                    armed = False
                    try:
                        if self.watchdog is not None and plan.launch.on_governor_exit == "kill":
                            # children first, then the slice like remove() does: the rmdir of
                            # a slice that still holds other groups fails harmlessly (EBUSY);
                            # above the group only what this run created
                            self.watchdog.arm(
                                plan.cgroup_root,
                                plan.group,
                                tuple(
                                    c
                                    for c in reversed(plan.create)
                                    if c in owned or c.startswith(plan.group)
                                ),
                                state=str(Publisher(job.run_dir or run_dir(), plan.policy).path),
                            )
                        armed = True
                    finally:
                        if not armed:
                            try:
                                self.backend.remove(plan, owned=owned)
                            finally:
                                self._give_clocks(job, clocks)
                try:
                    return self._run_applied(job)
                finally:
                    try:
                        if not job.keep:
                            self.backend.remove(plan, owned=owned)
                        else:
                            self._publish_kept(job, owned)
                    finally:
                        self._give_clocks(job, clocks)
        finally:
            if self.watchdog is not None:
                self.watchdog.disarm()

    def _take_clocks(self, job: Job) -> BoardClocks | None:
        """[clocks]: the watchdog learns to give them back first, then they are set (or
        shared) and verified (governor/backends/clocks.py)."""
        if not job.plan.clocks:
            return None
        from governor.backends.clocks import BoardClocks  # only for a policy with [clocks]

        directory = job.run_dir or run_dir()
        clocks = self.clocks or BoardClocks(directory, sysfs_root=job.sysfs_root)
        if self.watchdog is not None:
            self.watchdog.arm_clocks(str(directory), job.plan.policy, os.getpid(), job.sysfs_root)
        clocks.acquire(job.plan, pid=os.getpid(), source="launch")
        return clocks

    def _give_clocks(self, job: Job, clocks: BoardClocks | None) -> None:
        if clocks is not None:
            clocks.release(job.plan.policy, pid=os.getpid())

    def _publish_kept(self, job: Job, owned: set[str]) -> None:
        """--keep: the group outlives the run, as one `governor apply` made (status shows it;
        `governor remove` takes away what this run created, never an operator's slice)."""
        plan = job.plan
        if job.backend != "cgroupfs":
            return  # a transient scope ends with its last process
        Publisher(job.run_dir or run_dir(), plan.policy).publish(
            applied(
                plan,
                policy_path=plan.source,
                created=sorted(owned),
                started_at=self.started_at,
                kept_by="launch --keep",
            )
        )

    def _run_applied(self, job: Job) -> int:
        started = self.clock()
        self.publisher = Publisher(job.run_dir or run_dir(), job.plan.policy)
        if job.admit_note:  # why it runs now (`status` shows the journal): issue 36
            with contextlib.suppress(OSError):
                Journal((job.run_dir or run_dir()) / job.plan.policy).append(
                    "admit", [], reason=job.admit_note
                )
        try:
            return self._run_published(job, started)
        finally:
            self.publisher.remove()

    def _run_published(self, job: Job, started: float) -> int:
        plan, setup = job.plan, job.setup
        self.started_at = time.time()
        self.board = board_baseline(self.launcher.fs, self.proc, plan.slice)
        pid = self.engine_pid = self.launcher.start(plan, setup)
        leaves = self._start_model_leaves(job)
        self._await_ready(job, pid)
        self._start_helper(job, pid)
        restarts = self.restarts = Restarts(plan.launch.restart_max, plan.launch.restart_backoff_s)
        env = Env(
            self.launcher.fs,
            plan,
            board=Board(self.proc),
            restarts=restarts,
            journal=Journal((job.run_dir or run_dir()) / plan.policy),
            watchdog=self.watchdog,  # reverts a `shed` should this process die
        )
        monitor = self.monitor = Monitor(
            env,
            sample_s=job.sample_s,
            psi_triggers=job.psi_triggers,
            on_change=lambda: self._publish(job),
            peak=_estimate_total(job),
        )
        monitor.engine_started(pid)
        try:
            monitor.start()
            self._publish(job)
            pid, code, sig = self.launcher.supervise_restarting(
                plan,
                setup,
                pid,
                watcher=monitor,
                restarts=restarts,
                on_restart=lambda new_pid: self._restarted(job, new_pid),
                forwarder=self.forwarder,
            )
            wall = self.clock() - started
            report = self.launcher.summarize(
                plan, pid=pid, argv=setup.argv, code=code, sig=sig, wall=wall
            )
            report.extra["monitor"] = monitor.report()
            report.extra["restarts"] = restarts.history
            report.extra.update(job.extra)
            lock_error = self._collect_prefetch(report)
            learn_peak(job.extra, report)
            log.info("engine.exit", **{k: v for k, v in vars(report).items() if k != "argv"})
            if job.report is not None:
                _write_report(job.report, report)
        finally:
            if leaves is not None:
                leaves.stop()
            monitor.close()
            for waiter in (self.ready_wait, self.probe):
                if waiter is not None:
                    waiter.stop()
        if self.not_ready is not None:
            from governor.supervise.ready import EngineNotReady

            if self.unresponsive:  # it was ready, then stopped giving tokens
                from governor.supervise.generate import unresponsive_error

                raise unresponsive_error(self.not_ready, code)
            raise EngineNotReady(
                f"engine not ready: {self.not_ready}, exit {code} (engine.ready)",
                hint="raise engine.ready_timeout for a slow load, or fix engine.ready (the"
                " URL the engine answers 200 on once loaded)",
            )
        if lock_error is not None:
            raise lock_error
        return code

    def _start_model_leaves(self, job: Job) -> ModelLeaves | None:
        """llama-server's router: each child it starts into its model's leaf; each model's
        last request sampled and published (RunState.router) with its url; evict = memory."""
        if job.model_leaves is None:
            return None
        self.leaves = _router().router_leaves(
            self.launcher.fs,
            job.plan,
            limits=job.model_leaves,
            router_url=job.router_url,
            claims=(job.extra.get("estimate") or {}).get("router") or {},
            board=(job.run_dir or run_dir(), job.board_root),
            journal=Journal((job.run_dir or run_dir()) / job.plan.policy),
            router_pid=lambda: self.engine_pid,
            proc_root=self.proc.root,
            on_change=lambda: self._publish(job),
            slot_save=job.slot_save,
        )
        return self.leaves.start()

    def _await_ready(self, job: Job, pid: int) -> None:
        """READY=1 for Type=notify services (no-op without $NOTIFY_SOCKET): at exec, or once
        ``job.ready_url`` answers 200 (governor/supervise/ready.py); a server that does not
        answer within the timeout is stopped and the run fails (EngineNotReady, 69)."""
        plan = job.plan
        if job.ready_url is None:
            self._notify(f"READY=1\nSTATUS={plan.policy}: engine pid {pid} in {plan.leaf}")
            if plan.engine.probe_generate_s is not None:
                log.warning("engine.probe_unused", why="no server URL to ask (engine.ready)")
            return
        from governor.supervise import generate, ready

        self.not_ready = None
        self.unresponsive = False
        self.ready = False
        ep = ready.parse(job.ready_url)
        self._notify(f"STATUS={plan.policy}: engine pid {pid} loading, waiting for {ep.url}")

        def on_ready(waited: float) -> None:
            self.ready = True
            log.info("engine.ready", pid=pid, url=ep.url, waited_s=round(waited, 3))
            self._notify(f"READY=1\nSTATUS={plan.policy}: engine pid {pid} ready at {ep.url}")
            self._publish(job)
            interval = plan.engine.probe_generate_s  # not a router's: a completion loads
            if interval is not None and job.router_url is None:
                self.probe = generate.GenerateProbe(
                    ep, interval, on_unresponsive=on_unresponsive
                ).start()

        def on_unresponsive(why: str) -> None:  # supervise/generate.py
            self.unresponsive = True
            self.not_ready = generate.unresponsive(
                pid, why, restarts=self.restarts, stop_engine=ready.stop_engine,
                journal=Journal((job.run_dir or run_dir()) / plan.policy),
            )  # fmt: skip

        def on_timeout(why: str) -> None:
            self.not_ready = why
            log.error("engine.not_ready", pid=pid, why=why)
            sent = ready.stop_engine(pid)
            self.not_ready = f"{why}; it was stopped ({sent})"

        self.ready_wait = ready.ReadyWait(
            ep, job.ready_timeout_s, on_ready=on_ready, on_timeout=on_timeout
        ).start()

    def _notify(self, state: str) -> None:
        try:
            notify(state)
        except OSError as err:
            log.warning("sdnotify.failed", error=str(err))

    def _restarted(self, job: Job, engine_pid: int) -> None:
        self.engine_pid = engine_pid
        if self.monitor is not None:  # the new run's own peak (memory.peak reset, 6.12)
            self.monitor.sampler.reset_peak()
        if job.ready_url is not None:  # a relaunched server loads again: probe it again
            for waiter in (self.ready_wait, self.probe):
                if waiter is not None:
                    waiter.stop()
            self._await_ready(job, engine_pid)
        self._start_helper(job, engine_pid)
        self._publish(job)

    def _publish(self, job: Job) -> None:
        """The state `governor status` reads (governor/rundir/state.py)."""
        if self.publisher is None:
            return
        plan = job.plan
        monitor = self.monitor
        totals = monitor.totals() if monitor is not None else {}  # every handler's, once
        estimate = job.extra.get("estimate") or {}
        state = RunState(
            policy=plan.policy,
            source="launch",
            policy_path=plan.source,
            policy_sha256=job.policy_sha256,
            pid=os.getpid(),
            pid_start=own_start(),
            engine_pid=self.engine_pid,
            started_at=self.started_at,
            backend=job.backend,
            cgroup_root=plan.cgroup_root,
            group=plan.group,
            leaf=plan.leaf,
            restarts=len(self.restarts.history) if self.restarts else 0,
            model_bytes=job.model_bytes,
            rules=monitor.rule_states() if monitor is not None else [],
            last_actions=list(monitor.recent) if monitor is not None else [],
            action_totals=monitor.action_totals() if monitor is not None else [],
            model={k: estimate.get(k) for k in MODEL_KEYS if k in estimate} or None,
            prefetch_files=list(job.prefetch_files),
            plan=plan,
            systemd=job.systemd,
            ready=self.ready,
            board=self.board,
            qos=plan.qos.to_json(),
            shed_totals=totals.get("shed_totals", []),
            router=(
                _router().router_state(job.router_url, self.leaves, totals)
                if job.router_url is not None
                else None
            ),
            # --keep: the group and its claim outlive the engine (an admission's shed never
            # counts it, governor/board/budget.py); a transient scope ends with its last process
            kept_by="launch --keep" if job.keep and job.backend == "cgroupfs" else None,
        )
        self.state = state  # also what --metrics serves
        self.publisher.publish(state)
        if job.board_release is not None:
            job.board_release()  # idempotent: the next launch's admission sees this claim

    def _start_helper(self, job: Job, engine_pid: int) -> None:
        """The prefetch helper for this start of the engine (mode none: nothing)."""
        mode = job.plan.prefetch.mode
        if mode == "none" or not job.prefetch_files:
            return
        if self.helper is not None:
            self.helper.finish()
        fs, leaf, group = self.launcher.fs, job.plan.leaf, job.plan.group
        self.helper = PrefetchHelper(files=job.prefetch_files, mode=mode)
        self.helper.start(
            engine_pid,
            spawn=lambda: self.launcher.spawn(leaf),
            join=lambda: fs.move(0, leaf),
            kill_group=lambda: kill_own_group(fs, group),
        )

    def _collect_prefetch(self, report: LaunchReport) -> GovernorError | None:
        if self.helper is None:
            return None
        result, lock_errno = self.helper.finish()
        if result is None:
            return None
        result.fill(report)
        if lock_errno is None:
            return None
        cls = PermissionDenied if lock_errno in (errno.EPERM, errno.EACCES) else BackendError
        return cls(
            "prefetch.mode = lock could not lock the model; the engine was stopped",
            file=", ".join(result.files),
            errno=lock_errno,
            hint="mlock needs CAP_IPC_LOCK or RLIMIT_MEMLOCK above the files' size"
            " (run as root, or use prefetch.mode = populate)",
        )


def _write_report(path: Path, report: LaunchReport) -> None:
    try:
        path.write_text(report.to_json() + "\n")
    except OSError as err:
        # the engine ran: its status is what the caller gets; the report's loss is said
        log.error("report.failed", file=str(path), error=err.strerror or str(err))


def _estimate_total(job: Job) -> int | None:
    """The engine's estimated resident memory (its claimed peak), when launch made one."""
    total = (job.extra.get("estimate") or {}).get("total")
    return total if isinstance(total, int) and total > 0 else None


def _router() -> ModuleType:
    """supervise/models.py, imported for a router only (its evictor stays out of the others)."""
    from governor.supervise import models  # the router's only

    return models
