"""`governor monitor`'s run (governor/api/attach.py wires it): the pressure monitor attached to
a slice that already runs (made by `governor apply`, by systemd, or any cgroup given with
--cgroup).

Like a launch's supervisor it is a supervisor of its own: it publishes its state under
``/run/governor/<name>/`` (rules with their state, the last actions) for `governor status`,
`tune` and `metrics`, journals the limits its actions change, and keeps a tuned value as its
baseline. It refuses to attach where another live supervisor already governs the name (two
monitors acting on one slice fight). `governor apply`'s state is taken over while it runs (its
record of what apply created stays in it) and put back when it ends, if the slice is still
there."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from governor.errors import HostError
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.monitor.actions.base import Env
from governor.monitor.loop import Monitor
from governor.monitor.sources import Board
from governor.peer.files import read_capped
from governor.peer.router import base_url
from governor.plan.llama_args import options, server_address
from governor.plan.model import Plan
from governor.rundir.journal import Journal
from governor.rundir.liveness import alive, own_start
from governor.rundir.state import Publisher, RunState, run_dir
from governor.supervise.models import router_state
from governor.supervise.ready import server_url
from governor.supervise.watchdog import fork_watchdog

# what the monitor's state carries over from `governor apply`'s
KEPT_FROM_APPLY = ("created", "backend", "systemd")
PROC_CAP = 1 << 20  # an engine's /proc/<pid>/cmdline or environ (ARG_MAX-sized at most)
ROUTER_OPTS = frozenset({"--models-dir", "--models-preset"})
ROUTER_ENV = ("LLAMA_ARG_MODELS_DIR", "LLAMA_ARG_MODELS_PRESET")


def _words(raw: bytes) -> list[str]:
    return [w.decode("utf-8", "surrogateescape") for w in raw.rstrip(b"\0").split(b"\0") if w]


def router_url_of(proc_root: Path, pid: int) -> str | None:
    """The http://HOST:PORT of the llama-server router running as ``pid`` (issue 46 item 5: an
    attached monitor publishes its router), from its /proc cmdline and its environment's
    LLAMA_ARG_*, as a launch finds it (api/launch.py router_url); None for an engine that is
    no router, one whose address cannot be known, or a process gone."""
    try:
        argv = _words(read_capped(proc_root / str(pid) / "cmdline", PROC_CAP))
        env = dict(
            w.split("=", 1) for w in _words(read_capped(proc_root / str(pid) / "environ", PROC_CAP))
            if "=" in w
        )  # fmt: skip
    except OSError:
        return None
    if not argv or not Path(argv[0]).name.startswith("llama-server"):
        return None
    names = {o.name for o in options(argv[1:])}
    has_model = names & {"-m", "--model"} or env.get("LLAMA_ARG_MODEL")
    if has_model or not (names & ROUTER_OPTS or any(env.get(v) for v in ROUTER_ENV)):
        return None
    url = server_url(*server_address(argv, env))
    return None if url is None else base_url(url)


def take_over(publisher: Publisher, plan: Plan) -> RunState | None:
    """The state published before this monitor (`governor apply`'s, or a stale one), or
    HostError (69) when a live supervisor governs the name already."""
    prior = publisher.read()
    if prior is None or prior.source == "apply":
        return prior
    pid = prior.pid
    if pid is not None and pid != os.getpid() and alive(pid, start=prior.pid_start):
        raise HostError(
            f"{plan.policy} is governed already by governor pid {pid}"
            f" ({prior.source}, {publisher.path})",
            hint=f"its monitor acts on the slice: `governor status {plan.policy}` shows its"
            " rules; stop it first to attach another",
        )
    return None  # a stale state: replaced


def attach(
    plan: Plan,
    *,
    policy_path: Path,
    proc_root: Path,
    sample_s: float,
    psi_triggers: bool,
    duration_s: float | None,
    report: Path | None,
    serve: Callable[[Callable[[], list[RunState]]], Any] | None,
) -> dict[str, Any]:
    """Attach the pressure monitor to the plan's running group until SIGINT/SIGTERM/SIGHUP/
    SIGQUIT, ``duration_s`` or the group is gone; returns the monitor's report (also written to
    ``report``). ``serve``: starts the /metrics endpoint over the published state (closed at
    the end)."""
    fs = CgroupFs(Path(plan.cgroup_root))
    if not fs.exists(plan.group):
        raise HostError(
            f"nothing to monitor: {plan.group} does not exist ({plan.cgroup_root}/{plan.group})",
            hint="start it first (governor apply / launch, or its systemd unit), or pass --cgroup",
        )
    publisher = Publisher(run_dir(), plan.policy)
    prior = take_over(publisher, plan)

    def engine_pids() -> list[int]:
        where = plan.leaf if fs.exists(plan.leaf) else plan.group
        return fs.procs(where)

    state = _Published(plan, policy_path, prior, publisher, engine_pids, proc_root=proc_root)
    endpoint = None if serve is None else serve(lambda: list(state.snapshot))
    # a freeze action holds the group while it runs: the sh watchdog thaws it if the monitor
    # dies (SIGKILL, OOM); every signal that ends it otherwise goes through finish() below

    watchdog = fork_watchdog()
    try:
        watchdog.arm_thaw(plan.cgroup_root, plan.group)
        stopped: list[int] = []
        previous = {
            sig: signal.signal(sig, lambda n, _f: stopped.append(n))
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
        }
        deadline = None if duration_s is None else time.monotonic() + duration_s
        # no restarts here: the executor answers `restart` with "needs governor launch"
        env = Env(
            fs,
            plan,
            engine_pids=engine_pids,
            board=Board(ProcFs(proc_root)),
            journal=Journal(run_dir() / plan.policy),  # set actions journaled; tunes kept
            watchdog=watchdog,  # also reverts a `shed` should this process die
        )
        mon = Monitor(
            env,
            sample_s=sample_s,
            psi_triggers=psi_triggers,
            on_change=lambda: state.publish(mon),
        ).start()
        state.publish(mon)
        try:
            mon.run(
                lambda: bool(stopped) or (deadline is not None and time.monotonic() >= deadline)
            )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            out = mon.finish()
        if report is not None:
            report.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
        return out
    finally:
        watchdog.disarm()
        if endpoint is not None:
            endpoint.close()
        _hand_back(publisher, prior, gone=not fs.exists(plan.group))


class _Published:
    """The monitor's published state: built from the monitor's rules and actions on each change
    (``publish``), kept in ``snapshot`` for the /metrics endpoint's thread (which only reads the
    list's current item). Carries over what `governor apply`'s state recorded."""

    def __init__(
        self,
        plan: Plan,
        policy_path: Path,
        prior: RunState | None,
        publisher: Publisher,
        engine_pids: Callable[[], list[int]],
        *,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.plan, self.publisher, self.engine_pids = plan, publisher, engine_pids
        self.proc_root = proc_root
        self._router: tuple[int | None, str | None] = (None, None)  # (engine pid, its url)
        try:
            self.sha256: str | None = hashlib.sha256(policy_path.read_bytes()).hexdigest()
        except OSError:
            self.sha256 = None
        self.started_at, self.where = time.time(), str(policy_path.resolve())
        self.carried = {
            k: v for k in KEPT_FROM_APPLY if prior and (v := getattr(prior, k)) is not None
        }
        self.snapshot: list[RunState] = []

    def publish(self, mon: Monitor) -> None:
        plan = self.plan
        try:
            engine: int | None = next(iter(self.engine_pids()), None)
        except OSError:
            engine = None
        state = RunState(
            policy=plan.policy,
            source="monitor",
            policy_path=self.where,
            policy_sha256=self.sha256,
            pid=os.getpid(),
            pid_start=own_start(),
            started_at=self.started_at,
            backend=self.carried.get("backend", "cgroupfs"),
            cgroup_root=plan.cgroup_root,
            group=plan.group,
            leaf=plan.leaf,
            plan=plan,
            created=self.carried.get("created"),
            systemd=self.carried.get("systemd"),
            engine_pid=engine,
            rules=mon.rule_states(),
            last_actions=list(mon.recent),
            action_totals=mon.action_totals(),
            qos=plan.qos.to_json(),
            shed_totals=mon.totals().get("shed_totals", []),
            router=router_state(self.router_url(engine), None, mon.totals()),
        )
        self.snapshot[:] = [state]
        self.publisher.publish(state)

    def router_url(self, engine: int | None) -> str | None:
        """The engine's router url, read once per engine pid (a restart is read again)."""
        if engine is None:
            return None
        if self._router[0] != engine:
            self._router = (engine, router_url_of(self.proc_root, engine))
        return self._router[1]


def _hand_back(publisher: Publisher, prior: RunState | None, *, gone: bool) -> None:
    """At the monitor's end: apply's state again while its slice stands (status, remove's
    record); else none. Only our own: a launch of the name may have started meanwhile and
    published its own."""
    now = publisher.read()
    if now is not None and now.pid not in (os.getpid(), None):
        return
    if prior is not None and not gone:
        publisher.publish(prior)
    else:
        publisher.remove()
