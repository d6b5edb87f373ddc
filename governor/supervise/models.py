"""One leaf per model of llama-server's router (issue 38): each child the router starts goes
to ``<group>/models/<leaf>`` as soon as it appears, with that model's limits, so one child
that outgrows its estimate is OOM-killed alone while the router (``<group>/engine``) and the
other models keep serving.

The tree keeps cgroup v2's no-internal-process rule: processes only in leaves, the router in
``engine``, its children in the siblings under ``models`` (cgroup-v2.rst "No Internal Process
Constraint"); the group and ``models`` enable memory in their subtree_control.

The router forks and execs ``llama-server ... --alias NAME ... --model PATH`` (measured:
/proc/<pid>/cmdline of its children, llama.cpp 0c1e57098), so a child is found by polling the
engine leaf's cgroup.procs (a new process lands in its parent's cgroup) and reading its
cmdline, at once after each exec on the board (kernel/procevents.py, root) and every POLL_S: a
pid between fork and exec still shows the router's cmdline (no --alias) and is looked at again. The limits are written before the pid moves (no window
without them), and memory a process charged before the move stays with the old cgroup
(cgroup-v2.rst "Memory Ownership"): the poll is short (POLL_S) so the child moves before its
model is mapped, which takes it far longer than that (load logs: 0.1-1 s on a host, more
under TCG).

The alias is the router's name for the model, a peer's word: its leaf is
kernel/leafname.py's mapping (``/`` escaped, interface-file names prefixed), published with
the models (RunState.router). A model whose name maps to no leaf (a control character) or
whose leaf the kernel refuses is logged and journaled once and skipped: its children stay in
the engine leaf, under the engine's limits, and every other child is placed (issue 43 item 9).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.board import scan as board_scan
from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import LeafNameError, leaf_name, model_cgroup, models_cgroup
from governor.kernel.procevents import ExecWaker
from governor.log import get_logger
from governor.monitor.actions.unload import TOTALS, merge_unloads
from governor.peer.router import RouterClient
from governor.plan.llama_args import last_value
from governor.record import record
from governor.rundir import cap as run_cap
from governor.state.costs import CostBook
from governor.state.store import state_dir
from governor.supervise.activity import Activity
from governor.supervise.caphigh import CapHigh
from governor.supervise.evict import Evictor
from governor.supervise.leaving import LeavingLeaves
from governor.supervise.loads import Loads, child_model
from governor.supervise.slots import SlotKeeper
from governor.supervise.unloads import SHED_REASON, ShedUnloads

if TYPE_CHECKING:
    from governor.plan.model import Plan
    from governor.rundir.journal import Journal

log = get_logger(__name__)

POLL_S = 0.02  # between reads of the engine leaf's cgroup.procs
ALIAS_OPTS = ("-a", "--alias")  # llama-server's --alias (common/arg.cpp)
MODEL_CONTROLLERS = frozenset({"memory"})  # what a model's leaf limits (memory.max/high/oom.group)
SAMPLE_S = 0.5  # between two samples of the models' activity (supervise/activity.py Activity)
ROUTER_S = 2.0  # one whole request of the leaves' router client (a slot check, /models, unload)
PUBLISH_S = 1.0  # at most one republication of the models' state per this interval


@record(frozen=True)
class ModelLimits:
    """One model's leaf: memory.max / memory.high in bytes (None: not written) and
    memory.oom.group (None: the kernel's default)."""

    max: int | None = None
    high: int | None = None
    oom_group: bool | None = None

    @classmethod
    def read(cls, d: Mapping[str, Any]) -> ModelLimits:
        """From the plain mapping a launch hands the supervisor (api/launch.py model_leaves)."""
        return cls(max=d.get("max"), high=d.get("high"), oom_group=d.get("oom_group"))


def child_alias(cmdline: bytes) -> str | None:
    """The --alias of a llama-server child from its /proc/<pid>/cmdline (pure), as the router
    names the model (its leaf: kernel/leafname.py); None for a process that is no router child
    (yet). The last one given wins, as in llama.cpp; llama-server takes a comma-separated list
    of aliases: the first names the leaf."""
    found = last_value(cmdline, ALIAS_OPTS)  # another option's value is no alias (`-p --alias`)
    if found is None:
        return None
    alias = found.split(",")[0].encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return alias or None


class ModelLeaves:
    """Places the router's children into their leaves; ``poll`` is one pass (tests call it):
    :meth:`place` then :meth:`make_room`. ``start`` runs them in two threads until ``stop``.

    The placement thread (``place`` every POLL_S) never talks to the router: a child that does
    not fit enters its leaf frozen and is queued. The router thread makes room for the queued
    (supervise/evict.py, its calls bounded) and thaws each, whatever happens; with an
    ``activity`` it also samples each model's last request every SAMPLE_S (a placement dates
    its model's too) and calls ``on_change`` when one moved, an unload was counted or a child
    was placed, at most once per PUBLISH_S (the state file is not rewritten at every poll):
    ``tick`` is that step, :meth:`published` what it publishes. A router that stalls delays
    the activity and the evictions by its clients' deadlines, never a placement."""

    def __init__(
        self,
        fs: CgroupFs,
        *,
        group: str,
        leaf: str,
        limits: Mapping[str, ModelLimits | Mapping[str, Any]],
        router_pid: Callable[[], int | None],
        proc_root: Path = Path("/proc"),
        on_place: Callable[[str, int, str], None] | None = None,
        activity: Activity | None = None,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        evictor: Evictor | None = None,
        journal: Journal | None = None,
        slots: SlotKeeper | None = None,
        loads: Loads | None = None,
        cap_high: CapHigh | None = None,
    ) -> None:
        self.fs = fs
        self.group = group
        self.leaf = leaf
        self.limits = {
            a: v if isinstance(v, ModelLimits) else ModelLimits.read(v) for a, v in limits.items()
        }
        self.router_pid = router_pid
        self.proc_root = proc_root
        self.on_place = on_place
        self.placed: dict[int, str] = {}  # pid -> alias, every child moved in this run
        self.activity = activity
        self.on_change = on_change
        self.clock = clock
        self.evictor = evictor  # [engine] evict = "memory" (supervise/evict.py)
        self.loads = loads  # each model's load seconds and bytes (supervise/loads.py)
        self.unloads: dict[tuple[str, str], int] = {}  # (model, reason) -> how many
        self.journal = journal  # where a refused model is written once
        self.refused: dict[str, str] = {}  # model -> why it has no leaf (logged once)
        self.slots = slots  # --slot-save-path: the evicted models' slots (supervise/slots.py)
        self.cap_high = cap_high  # a lowered budget's memory.high (supervise/caphigh.py)
        self._dirty = False  # something to publish
        # another policy's shed's unloads of these models, from this run's journal
        self.sheds = None if journal is None else ShedUnloads(journal)
        self._sampled: float | None = None  # clock of the last activity sample
        self._published: float | None = None  # clock of the last on_change
        self._models_ready = False
        self.leaving = LeavingLeaves(fs, self.cgroup, clock=self.clock)  # unloaded models' leaves
        self._rooms: list[str] = []  # aliases placed frozen, waiting for make_room (FIFO)
        self._rooms_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # an exec on the board (kernel/procevents.py): poll now
        self._waker: ExecWaker | None = None
        self._threads: list[threading.Thread] = []

    def cgroup(self, alias: str) -> str:
        """The model's leaf (LeafNameError: its name maps to none)."""
        return model_cgroup(self.group, alias)

    def start(self) -> ModelLeaves:
        self._waker = ExecWaker.start(self._wake)  # None: no connector, POLL_S alone
        log.info("models.exec_events", on=self._waker is not None)
        for target, name in ((self._run, "model-leaves"), (self._run_router, "model-router")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._waker is not None:
            self._waker.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        for alias in self._take_rooms():  # queued, never made room for: not left frozen
            self._thaw(self.cgroup(alias))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_S)  # at once after an exec: a child moves before it loads
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.place()
            except GovernorError as err:  # the group went away (the run is ending)
                log.debug("models.poll_failed", error=str(err))
            except Exception as err:  # never the end of the placement thread
                log.error("models.poll_crashed", error=repr(err))

    def _run_router(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.make_room()
            except Exception as err:  # never the end of the router thread (evict's bugs)
                log.error("models.evict_crashed", error=repr(err))
            if self.slots is not None:
                try:
                    self.slots.restore()
                except Exception as err:  # nor a restore's
                    log.error("models.restore_crashed", error=repr(err))
            self.tick()

    def tick(self) -> bool:
        """Sample the activity when SAMPLE_S passed; call ``on_change`` when something moved
        and PUBLISH_S passed since the last call (and a lowered budget's memory.high round,
        supervise/caphigh.py). True when it was called."""
        now = self.clock()
        if self.cap_high is not None:
            self.cap_high.sync()  # never raises
        if self.loads is not None and self.loads.check():
            self._dirty = True
        if self.activity is not None and (self._sampled is None or now - self._sampled >= SAMPLE_S):
            self._sampled = now
            if self.activity.sample():
                self._dirty = True
            for model in self.sheds.new() if self.sheds is not None else ():
                self.count_unload(model, SHED_REASON)
        self.leaving.retry()
        if not self._dirty or self.on_change is None:
            return False
        if self._published is not None and now - self._published < PUBLISH_S:
            return False
        self._dirty = False
        self._published = now
        try:
            self.on_change()
        except Exception as err:  # publishing must not end the placement thread
            log.warning("models.publish_failed", error=str(err))
        return True

    def count_unload(self, model: str, reason: str) -> None:
        """One unload of ``model`` (the evictor's, once its child exited): counted, and its
        leaf removed once it holds no process (issue 46 item 5: a leaf stayed behind each
        unload; its next child gets a new one with its limits, supervise/models.py _leaf)."""
        key = (model, reason)
        self.unloads[key] = self.unloads.get(key, 0) + 1
        self._dirty = True
        self.leaving.add(model)

    def published(self) -> dict[str, Any]:
        """RunState.router's models and unloads (rundir/state.py): every model this run knows
        (its limits, its leaves) with its last request (epoch, None: none yet)."""
        last = dict(self.activity.last) if self.activity is not None else {}
        names = set(self.limits) | set(self.placed.values()) | set(last)
        return {
            "models": {
                a: {"last_request": last.get(a), "leaf": _leaf(a), **self._cost(a)}
                for a in sorted(names)
            },
            "unloads": [
                {"model": m, "reason": r, "count": n} for (m, r), n in sorted(self.unloads.items())
            ],
        }

    def _cost(self, alias: str) -> dict[str, Any]:
        cost = None if self.loads is None else self.loads.costs.get(alias)
        return {} if cost is None else {"load_s": round(cost.load_s, 3), "bytes": cost.bytes}

    def poll(self) -> list[tuple[int, str]]:
        """:meth:`place`, then :meth:`make_room` for those that entered frozen; returns
        (pid, alias) of the children moved now."""
        try:
            return self.place()
        finally:
            self.make_room()

    def make_room(self) -> None:
        """Room for each model that entered its leaf frozen (evict = "memory"), then its
        thaw, whatever the eviction does."""
        failed: BaseException | None = None
        for alias in self._take_rooms():
            try:
                assert self.evictor is not None
                self.evictor.make_room(alias)
            except Exception as err:  # the next queued one is made room for and thawed too
                failed = failed or err
            finally:
                self._thaw(self.cgroup(alias))
                if self.loads is not None:
                    self.loads.restart(alias)  # its load starts at its thaw
        if failed is not None:
            raise failed

    def _take_rooms(self) -> list[str]:
        with self._rooms_lock:
            rooms, self._rooms = self._rooms, []
        return rooms

    def _thaw(self, cg: str) -> None:
        try:
            self.fs.freeze(cg, False)
        except GovernorError as err:  # the leaf went away with the run
            log.warning("models.thaw_failed", cgroup=cg, error=str(err))

    def place(self) -> list[tuple[int, str]]:
        """Move every child of the router found in the engine leaf (no call to the router);
        returns (pid, alias) of those moved now."""
        router = self.router_pid()
        moved: list[tuple[int, str]] = []
        for pid in self.fs.procs(self.leaf):
            if pid == router:
                continue
            try:
                cmdline = (self.proc_root / str(pid) / "cmdline").read_bytes()
            except OSError:
                continue  # gone already
            alias = child_alias(cmdline)
            if alias is None:
                continue  # not exec'd yet, or not a router child: looked at again next poll
            if alias in self.refused:
                continue  # said once: it stays in the engine leaf
            if self._place(pid, alias):
                moved.append((pid, alias))
                if self.loads is not None:
                    self.loads.start(alias, child_model(cmdline, self.proc_root / str(pid) / "cwd"))
        return moved

    def _refuse(self, pid: int, alias: str, err: Exception) -> None:
        """Skip ``alias`` from now on: logged and journaled once, its children left in the
        engine leaf (its limits), every other child still placed."""
        why = str(err)
        self.refused[alias] = why
        log.warning("model.refused", pid=pid, alias=alias, error=why)
        if self.journal is not None:
            try:
                self.journal.append(
                    "models", [], model=alias,
                    error=f"no leaf for model {alias!r}, left in the engine leaf: {why}",
                )  # fmt: skip
            except OSError as jerr:
                log.warning("models.journal_failed", error=str(jerr))

    def _place(self, pid: int, alias: str) -> bool:
        try:
            cg = self._leaf(alias)
        except (LeafNameError, GovernorError) as err:
            if not self.fs.exists(self.leaf):
                raise  # the run is ending: not the model's fault
            self._refuse(pid, alias, err)
            return False
        limits = self.limits.get(alias, ModelLimits())
        # evict = "memory": a model that does not fit enters its leaf frozen (it allocates
        # nothing) and is queued: the router thread unloads idle models for it (make_room)
        # and thaws it, whatever happens
        frozen = self.evictor is not None and self.evictor.over(alias) is not None
        if frozen:
            self.fs.freeze(cg, True)
        try:
            self.fs.move(pid, cg)
        except GovernorError as err:  # it exited meanwhile (ESRCH)
            log.debug("models.move_failed", pid=pid, alias=alias, error=str(err))
            if frozen:
                self._thaw(cg)
            return False
        if frozen:
            with self._rooms_lock:
                self._rooms.append(alias)
        self._placed(pid, alias, cg, limits)
        return True

    def _leaf(self, alias: str) -> str:
        """The model's leaf, made with its limits when new (LeafNameError: its name maps to
        none; GovernorError: the kernel refused it)."""
        cg = self.cgroup(alias)
        if not self._models_ready:
            # the plan enables memory down to the group only (its limits are on the group):
            # the group (no process of its own) and models pass it on to each model's leaf
            wanted = sorted(MODEL_CONTROLLERS & self.fs.controllers(self.group))
            self.fs.enable(self.group, wanted)
            self.fs.mkdir(models_cgroup(self.group))
            self.fs.enable(models_cgroup(self.group), wanted)
            self._models_ready = True
        limits = self.limits.get(alias, ModelLimits())
        if self.fs.mkdir(cg):
            # the limits before the pid: it is never in the leaf without them
            try:
                if limits.oom_group is not None:
                    self.fs.write(cg, kf.MEMORY_OOM_GROUP, "1" if limits.oom_group else "0")
                if limits.max is not None:
                    self.fs.write(cg, kf.MEMORY_MAX, str(limits.max))
                if limits.high is not None:
                    self.fs.write(cg, kf.MEMORY_HIGH, str(limits.high))
            except GovernorError:
                with contextlib.suppress(GovernorError):
                    self.fs.rmdir(cg)  # never a leaf without its limits
                raise
        return cg

    def _placed(self, pid: int, alias: str, cg: str, limits: ModelLimits) -> None:
        self.placed[pid] = alias
        if self.slots is not None:
            self.slots.placed(alias)
        if self.activity is not None:
            self.activity.touch(alias)  # a model's load is its first request
        self._dirty = True
        log.info("model.placed", pid=pid, alias=alias, cgroup=cg, memory_max=limits.max)
        if self.on_place is not None:
            self.on_place(alias, pid, cg)


def _leaf(alias: str) -> str | None:
    try:
        return leaf_name(alias)
    except LeafNameError:
        return None


def router_leaves(
    fs: CgroupFs,
    plan: Plan,
    *,
    limits: Mapping[str, ModelLimits | Mapping[str, Any]],
    router_url: str | None,
    claims: Mapping[str, Any],
    board: tuple[Path, Path],
    journal: Journal | None,
    router_pid: Callable[[], int | None],
    proc_root: Path,
    on_change: Callable[[], None] | None,
    slot_save: bool = False,
    costs_dir: Path | None = None,
) -> ModelLeaves:
    """The supervisor's ModelLeaves for a router run: with the router's url, each model's
    activity (supervise/activity.py Activity) and, under ``[engine] evict = "memory"``, the
    evictor (supervise/evict.py; ``claims``: alias -> the model's estimate; ``board``: the run
    directory and the root the board is read from: the evictor's room under a group without
    memory.max is the board's free budget for this slice, governor/board/scan.py free_for);
    with ``slot_save`` (the router's --slot-save-path) the evictor's victims' slots are saved
    and restored at their next load (supervise/slots.py); ``costs_dir``: where each model's
    measured load is kept across runs (state/costs.py; None: state/store.py state_dir)."""
    activity = evictor = slots = loads = high = None
    if router_url is not None:
        # one for the activity's slot checks and the evictor, each request within ROUTER_S
        client = RouterClient(router_url, timeout=ROUTER_S)
        activity = Activity(fs, plan.group, client=client)
        book = CostBook(state_dir() if costs_dir is None else costs_dir)
        # its load is its first request: dated when the router says "loaded" (peer/router.py
        # FRESH_S: the request that loaded it is not yet at its slot)
        loads = Loads(fs, plan.group, client=client, book=book, on_loaded=activity.touch)
        if plan.engine.evict == "memory":
            if slot_save:
                slots = SlotKeeper(client, journal=journal)
            evictor = Evictor(
                fs,
                group=plan.group,
                leaf=plan.leaf,
                client=client,
                activity=activity,
                claims={a: v for a, v in claims.items() if isinstance(v, int)},
                board_free=functools.partial(board_scan.free_for, plan, *board),
                cap=functools.partial(run_cap.models_budget_for, plan, *board),
                journal=journal,
                before_unload=None if slots is None else slots.save,
                reload_s=loads.reload_s,
            )
            high = CapHigh(evictor, functools.partial(run_cap.held_for, plan, *board))
    leaves = ModelLeaves(
        fs, group=plan.group, leaf=plan.leaf, limits=limits, router_pid=router_pid,
        proc_root=proc_root, activity=activity, on_change=on_change, evictor=evictor,
        journal=journal, slots=slots, loads=loads, cap_high=high,
    )  # fmt: skip
    if evictor is not None:
        evictor.on_unload = leaves.count_unload
    return leaves


def router_state(
    url: str | None, leaves: ModelLeaves | None, totals: Mapping[str, list[dict[str, Any]]]
) -> dict[str, Any] | None:
    """RunState.router: the router's url, each model's last request, the unloads (the
    leaves' evictions and, in the monitor's ``totals``, the `unload` action's)."""
    if url is None:
        return None
    own = leaves.published() if leaves is not None else {"models": {}}
    unloads = merge_unloads(own.get("unloads", []), totals.get(TOTALS, []))
    return {"url": url, "models": own["models"], "unloads": unloads}
