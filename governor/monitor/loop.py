"""The monitor: PSI trigger fds + memory.events + cgroup.events in one epoll, a sample timer,
pure rules, actions. It plugs into the launcher's supervise loop as a *watcher*:
:meth:`Monitor.wait` adds the engine's pidfd to the monitor's own epoll and handles kernel
events and timers (sample, automatic thaw) until the engine exits. The wait is not nested in
another epoll on purpose: polling a PSI trigger fd consumes its event (kernel/sched/psi.c
psi_trigger_poll resets t->event), and an outer epoll checking the inner one's readiness would
swallow it. ``governor monitor`` runs the same object on its own with :meth:`Monitor.run`.
Idle cost: one wake-up per sample (1 s) to read memory.current/peak/stat; PSI and event
sources cost nothing until the kernel signals them.
PSI fallback: where a pressure file exists but refuses a trigger (a kernel before 5.2, an
unprivileged window that cannot be widened, EPERM on the write), the rule is evaluated from
``total=`` at each sample (psi.py PolledTrigger), and ``psi.fallback`` is logged once per file.
Where the file is missing (PSI disabled), ``psi.unavailable`` is logged once per file and the
rule cannot fire; the compiler refuses such a policy unless ``--allow-missing psi``.
``--psi poll`` (psi_triggers=False) forces the fallback (tests compare both paths).

Actions: the handlers registered for the plan's verbs (governor/monitor/actions/), each with
the same lifecycle (run at a firing, observe before the rules, tick at each turn, close at the
end, totals for the state): this loop never names a verb. :meth:`Monitor.engine_exited` takes a
last look (an OOM kill races the exit: a rule on ``oom_kill`` can still restart),
:meth:`Monitor.engine_started` points at the new pid.
"""

from __future__ import annotations

import collections
import select
import time
from collections.abc import Callable
from typing import Any

from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.procfs import ProcFs
from governor.log import get_logger
from governor.monitor import psi
from governor.monitor.actions.base import Context, Env, Result
from governor.monitor.actions.executor import Executor
from governor.monitor.rules import Firing, Observations, Rule, RuleEngine
from governor.monitor.sampler import DEFAULT_INTERVAL_S, Sampler
from governor.monitor.sources import Board, EventFile, Levels, open_optional
from governor.plan.model import WatchTrigger
from governor.record import replace

log = get_logger(__name__)

RECENT_FIRINGS = 10  # kept for the published state (status: the last actions)
MAX_REPORTED_FIRINGS = 200  # the report keeps the first ones; counts are always complete
REFAULT_STEP_PCT = 5.0  # a refault share this far off the published one republishes the state
_PRI = select.EPOLLPRI | select.EPOLLERR
_EXIT = object()  # the engine's pidfd in the epoll (launch)


class Monitor:
    def __init__(
        self,
        env: Env,
        *,
        sample_s: float = DEFAULT_INTERVAL_S,
        executor: Executor | None = None,
        psi_triggers: bool = True,
        on_change: Callable[[], None] | None = None,
        wall: Callable[[], float] = time.time,
        peak: int | None = None,
    ) -> None:
        """``env``: the collaborators, built once by whoever runs the monitor (actions/base.py
        Env: without ``engine_pids`` the engine is the pid given to :meth:`engine_started`,
        launch; without a ``board`` the host's /proc). ``peak``: the engine's estimate (a
        headroom rule's claimed peak, Rule.from_watch)."""
        if env.board is None:
            env = replace(env, board=Board(ProcFs()))
        assert env.board is not None
        self.env = env
        fs = self.fs = env.fs
        plan = self.plan = env.plan
        self.group = plan.group
        self.clock = env.clock
        self.rules = [Rule.from_watch(w, peak) for w in plan.watch]
        self.engine = RuleEngine(self.rules)
        self.board = env.board
        self.executor = executor or Executor(env)
        self.psi_triggers = psi_triggers
        self.sampler = Sampler(fs, self.group, interval_s=sample_s)
        # what the plan's rules compare (monitor/triggers.py): this loop names no kind
        self.levels = Levels(
            fs,
            self.group,
            self.board,
            self.rules,
            device=plan.device is not None,
            page_size=env.page_size,
        )
        self.devmem = self.levels.devmem
        self.thrash = self.levels.thrash
        self.armed: list[psi.Armed] = []
        self._psi_cgroup: dict[int, str] = {}  # rule -> where its trigger is armed
        self.mem_events: EventFile | None = None
        self.cg_events: EventFile | None = None
        self._epoll = select.epoll()
        self._by_fd: dict[int, Any] = {}
        self._polled_files: list[EventFile] = []
        self._next_sample = 0.0
        self._started = 0.0
        self.firings: list[dict[str, Any]] = []  # the report's: the first ones
        # the latest ones, whatever the count (the published state's last actions)
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_FIRINGS)
        self.action_counts: dict[tuple[int, str], int] = {}  # (rule, verb) -> times run
        self.oom_kills = 0
        self.event_totals: dict[str, int] = {}
        self.gone = False  # the group was removed or emptied
        self.populated: int | None = None
        # the supervisor republishes its state (governor/rundir/state.py)
        self.on_change = on_change
        self.wall = wall
        self._published: tuple[tuple[int, str], ...] | None = None

    @property
    def pid(self) -> int | None:
        """The engine's pid as the launcher told it (None: not started, or exited)."""
        return self.env.shared.pid

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Monitor:
        self._started = self.clock()
        for w in self.plan.watch:
            if isinstance(w.trigger, WatchTrigger):
                where = self._psi_cgroup[w.index] = "" if w.trigger.system else self.group
                armed = psi.arm(self.fs, where, w.index, w.trigger, triggers=self.psi_triggers)
                if armed.fd is not None and not self._register(armed.fd, armed):
                    # not a kernfs PSI file (test trees): the write "worked", nothing will fire
                    psi.close_trigger(armed.fd)
                    armed = psi.polled(w.index, w.trigger, "epoll refused the PSI file")
                self.armed.append(armed)
                log.info("psi.armed", cgroup=where or "<root: system-wide>", **armed.describe())
        self._say_fallbacks()
        self.mem_events = open_optional(self.fs, self.group, kf.MEMORY_EVENTS)
        self.cg_events = open_optional(self.fs, self.group, kf.CGROUP_EVENTS)
        for ev in (self.mem_events, self.cg_events):
            if ev is not None and not self._register(ev.fd, ev):
                ev.pollable = False
                self._polled_files.append(ev)
                log.info("monitor.polled_file", file=ev.file, detail="re-read at every sample")
        self._next_sample = self._started  # first sample at once
        return self

    def _say_fallbacks(self) -> None:
        """One warning per pressure file whose rules have no trigger (however many rules)."""
        said: set[tuple[str, str]] = set()
        for armed in self.armed:
            if armed.mode == "trigger" or (armed.file, armed.mode) in said:
                continue
            said.add((armed.file, armed.mode))
            rules = [a.rule for a in self.armed if (a.file, a.mode) == (armed.file, armed.mode)]
            if armed.mode == "polled":
                interval = f"{self.sampler.interval_s:g}s"
                log.warning(
                    "psi.fallback",
                    cgroup=self.group,
                    file=armed.file,
                    rules=rules,
                    reason=armed.reason,
                    detail=f"polling {armed.file} every {interval}",
                )
            else:
                log.warning(
                    "psi.unavailable",
                    cgroup=self.group,
                    file=armed.file,
                    rules=rules,
                    reason=armed.reason,
                    detail="these rules cannot fire; add psi=1 to the kernel command line",
                )

    def _register(self, fd: int, source: Any) -> bool:
        try:
            self._epoll.register(fd, _PRI)
        except PermissionError:  # a regular file (test trees): epoll refuses it
            return False
        self._by_fd[fd] = source
        return True

    def finish(self) -> dict[str, Any]:
        """Close every source and return the report (``LaunchReport.extra["monitor"]``)."""
        self.close()
        return self.report()

    def engine_started(self, pid: int) -> None:
        """The launcher started the engine (again): actions now target ``pid``."""
        self.env.shared.pid = pid

    def engine_exited(self) -> None:
        """The engine exited: a last look at the event files, with the rules run on what it
        finds. memory.events notifies asynchronously (cgroup_file_notify rate-limits, then
        kernfs_notify queues work), so the pidfd can be ready before the epoll saw the OOM
        kill that ended the engine; a rule on oom_kill (restart) must still fire."""
        counters = self.poll_files()
        if counters:
            self._evaluate(self.clock(), set(), counters, {})
        self.env.shared.pid = None

    def close(self) -> None:
        self.executor.close("monitor stopped")  # nothing left frozen, nor another slice shed
        self.poll_files()  # a last look: an OOM kill races the engine's exit
        psi.close_triggers([a.fd for a in self.armed if a.fd is not None])
        for ev in (self.mem_events, self.cg_events):
            if ev is not None:
                ev.close()
        self.sampler.close()
        self._epoll.close()

    # ------------------------------------------------------------------ waiting

    def timeout(self) -> float:
        """Seconds until the next timer (sample, an action's: an automatic thaw)."""
        deadlines = [self._next_sample]
        action = self.executor.deadline()
        if action is not None:
            deadlines.append(action)
        return max(0.0, min(deadlines) - self.clock())

    def wait(self, exit_fd: int, limit_s: float | None) -> bool:
        """The launcher's wait (launch/launcher.py Watcher): the engine's pidfd joins this
        epoll, so PSI trigger events are seen by the one poll that consumes them."""
        if self._by_fd.get(exit_fd) is not _EXIT:
            self._epoll.register(exit_fd, select.EPOLLIN)
            self._by_fd[exit_fd] = _EXIT
        timeout = self.timeout() if limit_s is None else min(self.timeout(), limit_s)
        ready = self._epoll.poll(timeout)
        exited = any(fd == exit_fd for fd, _ in ready)
        self._handle([(fd, mask) for fd, mask in ready if fd != exit_fd])
        if exited:
            self._epoll.unregister(exit_fd)
            del self._by_fd[exit_fd]
        return exited

    def dispatch(self) -> None:
        """Handle whatever is ready now, without waiting (tests, callers with own timers)."""
        self._handle(self._epoll.poll(0))

    def run(self, stop: Callable[[], bool]) -> None:
        """Standalone loop (``governor monitor``): until stop() or the group is gone."""
        while not stop() and not self.gone:
            self._handle(self._epoll.poll(self.timeout()))

    def _handle(self, ready: list[tuple[int, int]]) -> None:
        """Kernel events that are ready, then due timers."""
        fired_psi: set[int] = set()
        counters: dict[str, int] = {}
        for fd, mask in ready:
            source = self._by_fd.get(fd)
            if isinstance(source, psi.Armed):
                if mask & select.EPOLLERR:
                    self._lost(fd, source.file)
                elif mask & select.EPOLLPRI:
                    fired_psi.add(source.rule)
            elif isinstance(source, EventFile):
                try:
                    counters.update(self._event_file(source))
                except GovernorError:
                    self._lost(fd, source.file)
        now = self.clock()
        sampled: dict[str, Any] = {}
        if now >= self._next_sample:
            sampled = self._sample(now, fired_psi, counters)
            self._next_sample = max(now, self._next_sample + self.sampler.interval_s)
        self.executor.observe(now, fired_psi, sampled=bool(sampled))
        if fired_psi or counters or sampled or any(self.engine.active(r.index) for r in self.rules):
            self._evaluate(now, fired_psi, counters, sampled)
        self._tick(self.clock())
        self._maybe_changed()

    def _tick(self, now: float) -> None:
        """The actions' timers and give-backs (a thaw, a shed's undo step)."""
        quiet = self.engine.quiet
        for done in self.executor.tick(now, lambda rule, cooldown: quiet(rule, now, cooldown)):
            if done.publish:  # as the published state's last actions show a firing
                self.recent.append(
                    {
                        "rule": -1,
                        "when": done.when,
                        "at": round(self.wall(), 3),
                        "actions": [done.result.as_dict()],
                    }
                )
                self._published = None  # republish: what the action holds changed

    def rule_states(self) -> list[dict[str, Any]]:
        """Each rule's state (monitor/rules.py describe) with its times as epoch seconds."""
        now = self.clock()
        offset = self.wall() - now
        out = self.engine.describe(now)
        for item in out:
            if item["rule"] in self.thrash.meters:
                item["refaults_pct"] = self.thrash.now_pct(item["rule"])
            for key in ("since", "last_fired", "hold_until", "cooldown_until"):
                if item.get(key) is not None:
                    item[key] = round(item[key] + offset, 3)
        return out

    def totals(self) -> dict[str, list[dict[str, Any]]]:
        """The actions' own counters by the published state's field (``shed_totals``: the
        shed steps and undos per victim, the metrics' governor_shed_total)."""
        return self.executor.totals()

    def action_totals(self) -> list[dict[str, Any]]:
        """How many times each rule ran each action verb (the metrics' actions_total)."""
        return [
            {"rule": rule, "action": verb, "count": n}
            for (rule, verb), n in sorted(self.action_counts.items())
        ]

    def _maybe_changed(self) -> None:
        """Tell on_change when a rule changed state or fired (not at every sample)."""
        if self.on_change is None:
            return
        states = self.engine.describe(self.clock())
        sig = tuple((r["rule"], f"{r['state']}/{r['fired']}") for r in states)
        # the refault share moves status's "now N%": republish when it crosses a 5-point step
        sig += self.thrash.signature(REFAULT_STEP_PCT)
        if sig != self._published:
            self._published = sig
            self.on_change()

    # ------------------------------------------------------------------ sources

    def _lost(self, fd: int, file: str) -> None:
        # POLLERR on a trigger fd: the cgroup went away (psi.rst)
        self._epoll.unregister(fd)
        self._by_fd.pop(fd, None)
        if not self.gone:
            log.info("monitor.group_gone", cgroup=self.group, file=file)
        self.gone = True

    def _event_file(self, ev: EventFile) -> dict[str, int]:
        inc, new = ev.changes()
        if ev.file == kf.CGROUP_EVENTS:
            if self.populated != new.get("populated"):
                self.populated = new.get("populated")
                if self.populated == 0:
                    log.info("cgroup.empty", cgroup=self.group)
            return {}
        for key, n in inc.items():
            self.event_totals[key] = self.event_totals.get(key, 0) + n
        if inc.get("oom_kill"):
            self.oom_kills += inc["oom_kill"]
            log.warning(
                "memory.oom_kill",
                cgroup=self.group,
                count=inc["oom_kill"],
                total=new.get("oom_kill"),
            )
        return inc

    def poll_files(self) -> dict[str, int]:
        """Re-read the event files now (those epoll could not watch, or a final look)."""
        counters: dict[str, int] = {}
        for ev in (self.mem_events, self.cg_events):
            if ev is not None:
                try:
                    counters.update(self._event_file(ev))
                except GovernorError:
                    continue
        return counters

    def _sample(self, now: float, fired_psi: set[int], counters: dict[str, int]) -> dict[str, Any]:
        s = self.sampler.sample(now)
        out: dict[str, Any] = {"sample": s}
        for ev in self._polled_files:
            try:
                counters.update(self._event_file(ev))
            except GovernorError:
                continue
        for armed in self.armed:
            if armed.poller is not None:
                total = self._psi_total(armed)
                if total is not None and armed.poller.update(now, total):
                    fired_psi.add(armed.rule)
        out.update(self.levels.sample(now, s))
        return out

    def _psi_total(self, armed: psi.Armed) -> int | None:
        try:
            return psi.total_us(self.fs, self._psi_cgroup[armed.rule], armed.file, armed.kind)
        except GovernorError:
            return None

    # ------------------------------------------------------------------ rules and actions

    def _evaluate(
        self, now: float, fired_psi: set[int], counters: dict[str, int], sampled: dict[str, Any]
    ) -> None:
        obs = Observations(
            psi=frozenset(fired_psi),
            counters=counters,
            memavailable=sampled.get("memavailable"),
            available=sampled.get("available"),
            spare=sampled.get("spare"),
            board_file=sampled.get("board_file"),
            current=sampled["sample"].current if "sample" in sampled else None,
            leak=sampled.get("leak", {}),
            device=sampled.get("device"),
            refaults=sampled.get("refaults", {}),
            extra=sampled.get("extra", {}),
        )
        for firing in self.engine.step(now, obs):
            self._fire(firing)

    def _fire(self, f: Firing) -> None:
        rule = f.rule
        log.warning(
            "rule.fired",
            rule=rule.index,
            when=rule.when,
            value=f.value,
            active_s=round(f.active_s, 3),
            actions=[str(a) for a in rule.actions],
            t_s=round(f.now - self._started, 3),
        )
        ctx = Context(rule=rule.index, when=rule.when, value=f.value, active_s=f.active_s)
        results: list[Result] = []
        for action in rule.actions:
            res = self.executor.execute(action, ctx)
            results.append(res)
            key = (rule.index, action.verb)
            self.action_counts[key] = self.action_counts.get(key, 0) + 1
            if self.executor.ends_firing(action, res):
                break  # nothing is left to act on
        firing = {
            "rule": rule.index,
            "when": rule.when,
            "at": round(self.wall(), 3),
            "t_s": round(f.now - self._started, 3),
            "active_s": round(f.active_s, 3),
            "value": f.value,
            "actions": [r.as_dict() for r in results],
        }
        self.recent.append(firing)
        if len(self.firings) < MAX_REPORTED_FIRINGS:
            self.firings.append(firing)

    # ------------------------------------------------------------------ report

    def report(self) -> dict[str, Any]:
        counts = self.engine.fired_counts()
        return {
            "rules": [
                {"rule": r.index, "when": r.when, "fired": counts.get(r.index, 0)}
                for r in self.rules
            ],
            "firings": self.firings,
            "oom_kill_seen": self.oom_kills,
            "memory_events": self.event_totals,
            "psi": [a.describe() for a in self.armed],
            "sampler": self.sampler.summary(),
            **self.devmem.report(),
        }
