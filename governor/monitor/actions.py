"""Actions of a fired rule, through the one door to cgroupfs (CgroupFs) and os.kill.

Each action logs ONE structured event, ``action.done`` (or ``action.failed``), with the rule,
the verb and the values before and after. Failures are logged and reported, never raised: the
monitor must keep watching and the engine must keep running.

Bounds: ``set memory.X`` never goes above the plan's memory.max (the live one when the plan has
none) and never below memory.min (cgroup-v2.rst: memory.high below memory.min would reclaim
protected memory; memory.max below usage triggers OOM). Values are page-floored the way the
kernel stores them (mm/page_counter.c).

Older kernels (a board's 5.10): ``kill``/``restart`` without cgroup.kill and ``reclaim``
without memory.reclaim do the same job by the interfaces they have (governor/monitor/fallbacks.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal as signal_mod
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from governor.errors import BackendError, GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.parse import format_max, parse_flat_keyed, parse_max
from governor.log import get_logger
from governor.monitor.fallbacks import kill_tree, reclaim_by_high
from governor.monitor.restart import NO_SUPERVISOR, Restarts
from governor.plan.model import Action, Plan
from governor.record import record
from governor.rundir.journal import Journal
from governor.rundir.state import alive

if TYPE_CHECKING:
    from governor.monitor.shed import Shedder

log = get_logger(__name__)

EXEC_TIMEOUT_S = 10.0  # an exec action's command is killed after this
EXEC_OUTPUT_MAX = 4096  # bytes of stdout/stderr kept in the log
FREEZE_WAIT_S = 5.0  # how long to wait for cgroup.events "frozen 1"
CPU_WEIGHT_MIN, CPU_WEIGHT_MAX = 1, 10000  # cgroup-v2.rst "cpu.weight"
THAW = Action(verb="thaw", text="thaw")
_MEMORY_BOUNDED = (kf.MEMORY_MIN, kf.MEMORY_LOW, kf.MEMORY_HIGH, kf.MEMORY_MAX)


@record(frozen=True)
class Context:
    """What the action knows about why it runs (also the exec action's environment)."""

    rule: int
    when: str
    value: float | int | None = None
    active_s: float = 0.0

    def env(self, cgroup: str) -> dict[str, str]:
        return {
            "GOVERNOR_RULE": str(self.rule),
            "GOVERNOR_WHEN": self.when,
            "GOVERNOR_VALUE": "" if self.value is None else str(self.value),
            "GOVERNOR_ACTIVE_S": f"{self.active_s:.3f}",
            "GOVERNOR_CGROUP": cgroup,
        }


@record
class Result:
    action: str
    ok: bool
    before: Any = None
    after: Any = None
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


@record
class Executor:
    fs: CgroupFs
    plan: Plan
    engine_pids: Callable[[], Sequence[int]]
    clock: Callable[[], float] = time.monotonic
    run: Callable[..., Any] | None = None  # subprocess.run (imported when an exec runs)
    kill: Callable[[int, int], None] = os.kill
    page_size: int = os.sysconf("SC_PAGE_SIZE")
    thaw_at: float | None = None  # pending automatic thaw (the loop's timer)
    frozen_by_us: bool = False
    # the launcher's relaunch budget (governor launch); None when attached (governor monitor)
    restarts: Restarts | None = None
    # the slice's change journal (governor/rundir/journal.py): set actions are journaled, and a file
    # the operator tuned keeps its value (absolute sets skip it; bounds follow the tune); a shed
    # that holds on the slice is its baseline (memory.high never above the throttle, no thaw)
    journal: Journal | None = None
    shedder: Shedder | None = None  # the `shed` action (governor/monitor/shed.py)
    alive: Callable[[int | None], bool] = alive  # a shedder's pid still runs a governor

    @property
    def group(self) -> str:
        return self.plan.group

    # ------------------------------------------------------------------ dispatch

    def execute(self, action: Action, ctx: Context) -> Result:
        handler = getattr(self, f"_do_{action.verb}")
        try:
            res: Result = handler(action, ctx)
        except GovernorError as err:
            res = Result(str(action), ok=False, detail=str(err))
        except (OSError, ValueError) as err:  # SubprocessError: caught in _do_exec
            res = Result(str(action), ok=False, detail=f"{type(err).__name__}: {err}")
        event = "action.done" if res.ok else "action.failed"
        (log.info if res.ok else log.warning)(
            event, rule=ctx.rule, when=ctx.when, cgroup=self.group, **res.as_dict()
        )
        return res

    def on_timer(self, now: float) -> Result | None:
        """The automatic thaw of a timed freeze, once its time has come."""
        if self.thaw_at is None or now < self.thaw_at:
            return None
        self.thaw_at = None
        return self.execute(THAW, Context(rule=-1, when="freeze expired"))

    # ------------------------------------------------------------------ verbs

    def _do_log(self, action: Action, ctx: Context) -> Result:
        return Result("log", ok=True, detail=f"value={ctx.value} active_s={ctx.active_s:.2f}")

    def _do_signal(self, action: Action, ctx: Context) -> Result:
        assert action.signal is not None
        sig = signal_mod.Signals[action.signal]
        pids = list(self.engine_pids())
        sent = []
        for pid in pids:
            try:
                self.kill(pid, sig)
                sent.append(pid)
            except ProcessLookupError:
                continue
        return Result(
            str(action),
            ok=bool(sent),
            after={"pids": sent},
            detail=None if sent else "no engine process",
        )

    def _do_reclaim(self, action: Action, ctx: Context) -> Result:
        assert action.bytes is not None
        before = self._current()
        try:
            self.fs.write(self.group, kf.MEMORY_RECLAIM, str(action.bytes))
            detail = None
        except BackendError as err:
            if err.errno == errno.ENOENT and (self.fs.path(self.group) / kf.MEMORY_HIGH).exists():
                lower, _ = self._bounds(kf.MEMORY_HIGH)  # Linux < 5.19
                detail = reclaim_by_high(
                    self.fs, self.group, action.bytes, before, lower=lower, page=self.page_size
                )
            # memory.reclaim returns EAGAIN when it reclaimed less than asked (cgroup-v2.rst)
            elif err.errno != errno.EAGAIN:
                raise
            else:
                detail = "EAGAIN: reclaimed less than asked"
        return Result(str(action), ok=True, before=before, after=self._current(), detail=detail)

    def _journal_locked(self) -> contextlib.AbstractContextManager[object]:
        """The slice journal's lock around read-baseline-write: a higher class's shed writes
        its step and journals it under the same lock, so a set never lifts a throttle whose
        entry it could not see yet (seen in the guest: 19 ms between the two). A journal
        that cannot be locked (an unwritable run dir) does not stop the action."""
        if self.journal is None:
            return contextlib.nullcontext()
        return self.journal.try_locked()

    def _do_set(self, action: Action, ctx: Context) -> Result:
        with self._journal_locked():
            return self._set(action, ctx)

    def _set(self, action: Action, ctx: Context) -> Result:
        assert action.file is not None
        file = action.file
        before_text = self.fs.read(self.group, file).strip()
        tuned = self.journal.tuned(file) if self.journal is not None else None
        if tuned is not None and action.relative_percent is None:
            return Result(
                str(action),
                ok=True,
                before=before_text,
                after=before_text,
                detail=f"kept: the operator tuned {file} to {tuned}",
            )
        value = self._target(action, before_text)
        if value == before_text:
            return Result(str(action), ok=True, before=before_text, after=value, detail="at bound")
        self.fs.write(self.group, file, value)
        after = self.fs.read(self.group, file).strip()
        if self.journal is not None:
            self.journal.append(
                "monitor",
                [{"cgroup": self.group, "file": file, "before": before_text, "after": after}],
                rule=ctx.rule,
                action=str(action),
            )
        return Result(str(action), ok=True, before=before_text, after=after)

    def _do_freeze(self, action: Action, ctx: Context) -> Result:
        assert action.duration_s is not None
        before = self._frozen()
        self.fs.freeze(self.group, True)
        t0 = self.clock()
        frozen = self._wait_frozen(True)
        self.frozen_by_us = True
        self.thaw_at = self.clock() + action.duration_s
        return Result(
            str(action),
            ok=frozen,
            before={"frozen": before},
            after={"frozen": int(frozen), "wait_s": round(self.clock() - t0, 3)},
            detail=None if frozen else f"cgroup.events not 'frozen 1' after {FREEZE_WAIT_S}s",
        )

    def _do_shed(self, action: Action, ctx: Context) -> Result:
        if self.shedder is None:  # the monitor makes one for every plan with a shed rule
            return Result("shed", ok=False, detail="no shedder for this monitor")
        return self.shedder.shed(ctx)

    def _shed_hold(self) -> dict[str, Any] | None:
        """The shed a higher class holds on this slice (its journal), None without one."""
        return self.journal.shed(self.alive) if self.journal is not None else None

    def _do_thaw(self, action: Action, ctx: Context) -> Result:
        with self._journal_locked():
            hold = self._shed_hold()
            if hold is not None and hold["frozen"]:
                self.thaw_at = None
                self.frozen_by_us = False
                return Result("thaw", ok=True, detail=f"kept frozen: shed by {hold['by']}")
            before = self._frozen()
            self.fs.freeze(self.group, False)
        self.thaw_at = None
        self.frozen_by_us = False
        thawed = self._wait_frozen(False)
        return Result(
            "thaw", ok=thawed, before={"frozen": before}, after={"frozen": int(not thawed)}
        )

    def _do_kill(self, action: Action, ctx: Context) -> Result:
        before = self._procs()
        how = self._kill_group()
        return Result("kill", ok=True, before={"procs": before}, detail=how)

    def _kill_group(self) -> str | None:
        """None (cgroup.kill) or how the kernel without it was made to do the same."""
        how = kill_tree(self.fs, self.group, self.kill, clock=self.clock)
        if self.frozen_by_us:  # SIGKILL reaches frozen tasks, but thaw so they can exit
            self.fs.freeze(self.group, False)
            self.thaw_at = None
            self.frozen_by_us = False
        return how

    def _do_exec(self, action: Action, ctx: Context) -> Result:
        import subprocess

        try:
            identity = exec_identity(self.plan.launch.user, self.plan.launch.group)
        except KeyError as err:
            return Result(str(action), ok=False, detail=f"cannot run as {err.args[0]}")
        env = exec_environment(identity.get("env", {}))
        env.update(ctx.env(f"{self.plan.cgroup_root}/{self.group}"))
        run = self.run or subprocess.run
        try:
            done = run(
                list(action.argv),
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=EXEC_TIMEOUT_S,
                check=False,
                close_fds=True,
                cwd="/",
                user=identity.get("user"),
                group=identity.get("group"),
                extra_groups=identity.get("extra_groups"),
            )
        except subprocess.TimeoutExpired as err:
            return Result(
                str(action),
                ok=False,
                detail=f"killed after {EXEC_TIMEOUT_S:g}s",
                after={"stdout": _cut(err.stdout)},
            )
        except subprocess.SubprocessError as err:
            return Result(str(action), ok=False, detail=f"{type(err).__name__}: {err}")
        return Result(
            str(action),
            ok=done.returncode == 0,
            after={
                "exit": done.returncode,
                "stdout": _cut(done.stdout),
                "stderr": _cut(done.stderr),
            },
        )

    def _do_restart(self, action: Action, ctx: Context) -> Result:
        """Kill the whole group; the launcher relaunches the engine once it has exited (also
        when it had already died: cgroup.kill of an empty group is a no-op)."""
        if self.restarts is None:
            return Result("restart", ok=False, detail=NO_SUPERVISOR)
        refused = self.restarts.refusal()
        if refused is not None:
            return Result("restart", ok=False, detail=refused)
        before = self._procs()
        how = self._kill_group()
        req = self.restarts.request(ctx.rule, ctx.when)
        return Result(
            "restart",
            ok=True,
            detail=how,
            before={"procs": before},
            after={
                "attempt": req.attempt,
                "limit": self.restarts.limit,
                "backoff_s": req.backoff_s,
            },
        )

    # ------------------------------------------------------------------ helpers

    def _target(self, action: Action, before_text: str) -> str:
        """The value to write for ``set``, within bounds."""
        file = action.file
        assert file is not None
        if file == kf.CPU_WEIGHT:
            weight = int(before_text)
            if action.relative_percent is not None:
                weight = scale_percent(weight, action.relative_percent)
            elif action.value:
                weight = int(action.value)
            return str(min(max(weight, CPU_WEIGHT_MIN), CPU_WEIGHT_MAX))
        if file == kf.CPU_MAX:
            assert action.value is not None
            return action.value  # compiled to the kernel's "quota period"
        lower, upper = self._bounds(file)
        if action.relative_percent is not None:
            base = parse_max(before_text)
            if base is None and not action.relative_percent.startswith("-"):
                return before_text  # "max" raised by 10% is still "max": never a tightening
            if base is None:  # "max": lower relative to the bound, or to what is in use
                base = upper if upper is not None else (self._current() or 0)
            want: int | None = scale_percent(base, action.relative_percent)
        else:
            want = action.bytes  # None: "max"
        if want is None:
            want = upper  # "max" is capped by the plan's memory.max
        if want is not None:
            if upper is not None:
                want = min(want, upper)
            want = max(want, lower)
            want = want // self.page_size * self.page_size
        return format_max(want)

    def _bounds(self, file: str) -> tuple[int, int | None]:
        """(lower, upper) for a memory file: [memory.min, memory.max of the plan]."""
        if file not in _MEMORY_BOUNDED:
            return 0, None
        tuned_max = self.journal.tuned(kf.MEMORY_MAX) if self.journal is not None else None
        plan_max = (
            parse_max(tuned_max) if tuned_max is not None else self._plan_value(kf.MEMORY_MAX)
        )
        upper = plan_max if plan_max is not None else self._live(kf.MEMORY_MAX)
        lower = 0 if file == kf.MEMORY_MIN else (self._live(kf.MEMORY_MIN) or 0)
        hold = self._shed_hold() if file == kf.MEMORY_HIGH else None
        shed_high = parse_max(hold["memory_high"]) if hold and hold["memory_high"] else None
        if shed_high is not None:  # a higher class throttled it: never raised above that
            upper = shed_high if upper is None else min(upper, shed_high)
        return lower, upper

    def _plan_value(self, file: str) -> int | None:
        for w in self.plan.writes:
            if w.file == file and w.cgroup == self.group:
                return parse_max(w.value)
        return None

    def _live(self, file: str) -> int | None:
        try:
            return parse_max(self.fs.read(self.group, file))
        except GovernorError:
            return None

    def _current(self) -> int | None:
        return self._live(kf.MEMORY_CURRENT)

    def _procs(self) -> int:
        try:
            return sum(len(self.fs.procs(g)) for g in (self.group, self.plan.leaf))
        except GovernorError:
            return 0

    def _frozen(self) -> int | None:
        try:
            return self.fs.events(self.group).get("frozen")
        except GovernorError:
            return None

    def _wait_frozen(self, want: bool) -> bool:
        """Wait until cgroup.events says ``frozen <want>``: poll() on the file for its
        modified notification (POLLPRI), re-reading after each wake-up."""
        import select

        deadline = self.clock() + FREEZE_WAIT_S
        fd = self.fs.open_watch(self.group, kf.CGROUP_EVENTS)
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
            while True:
                text = os.pread(fd, 4096, 0).decode()
                if parse_flat_keyed(text).get("frozen", 0) == int(want):
                    return True
                left = deadline - self.clock()
                if left <= 0:
                    return False
                poller.poll(min(left, 0.5) * 1000)
        finally:
            os.close(fd)


EXEC_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_EXEC_KEPT_ENV = ("LANG", "LC_ALL", "TZ")


def exec_identity(user: str | None, group: str | None) -> dict[str, Any]:
    """How an exec action runs: as the policy's process.user/group (never as root with the
    governor's privileges when the engine itself runs unprivileged). Without privileges to
    switch, as the governor's own user, said in the log. KeyError names an unknown user/group."""
    import grp
    import pwd

    if user is None and group is None:
        return {}
    if os.geteuid() != 0:
        log.warning(
            "action.exec.as_self",
            user=user,
            group=group,
            reason="the governor is not root and cannot switch to process.user",
        )
        return {}
    out: dict[str, Any] = {}
    if user is not None:
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise KeyError(f"process.user {user!r} (no such user)") from None
        out["user"] = pw.pw_uid
        out["group"] = pw.pw_gid
        out["extra_groups"] = os.getgrouplist(pw.pw_name, pw.pw_gid)
        out["env"] = {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name}
    if group is not None:
        try:
            out["group"] = grp.getgrnam(group).gr_gid
        except KeyError:
            raise KeyError(f"process.group {group!r} (no such group)") from None
        out.setdefault("extra_groups", [out["group"]])
    return out


def exec_environment(identity_env: dict[str, str]) -> dict[str, str]:
    """A clean environment for an exec action: a fixed PATH, the locale, the user's HOME/USER;
    nothing else of the governor's (no secrets a service's environment may hold)."""
    env = {"PATH": EXEC_PATH}
    env.update({k: os.environ[k] for k in _EXEC_KEPT_ENV if k in os.environ})
    env.update(identity_env)
    return env


def scale_percent(base: int, percent: str) -> int:
    """``base`` changed by ``percent`` ("-10", "+12.5"), exactly (integer arithmetic on the
    decimal text, rounded toward zero like int(Decimal)): no float error on byte counts."""
    sign = -1 if percent.startswith("-") else 1
    whole, _, frac = percent.lstrip("+-").partition(".")
    den = 100 * int("1" + "0" * len(frac))
    num = sign * int(whole + frac)
    total = base * (den + num)
    return total // den if total >= 0 else -(-total // den)


def _cut(data: bytes | str | None) -> str | None:
    if not data:
        return None
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return text[-EXEC_OUTPUT_MAX:]
