"""``[engine] evict = "memory"`` (issue 38 item 3): room for a model before it allocates.

llama-server's router evicts by count (``--models-max``), whatever the models weigh. With this
policy the governor does it by memory: when a new child (alias X) is placed into its leaf
(supervise/models.py) and

    used = the claims of the models loaded now (each model leaf with a process: its estimate,
           else its leaf's memory.max, else its memory.current)
         + the router's own memory (the engine leaf's memory.current)
         + X's claim

passes the budget (the group's memory.max read now, else the board's free budget: what
admission counts, handed in by the launch; at most the budget a higher-class admission
lowered it to while that tenant runs, rundir/cap.py), X's leaf is frozen BEFORE the pid moves in (a
process that enters a frozen cgroup is frozen: it never allocates before room is made), the
idle models (peer/router.py idle_lru, X excluded) are unloaded one at a time through the
router until it fits, each waited for (bounded: WAIT_S; the router's stop-timeout is 10 s)
until its leaf has no process, and X is thawed, always (finally).

Which idle model goes first is the board's victim order by value (issue 46 item 2,
board/order.py by_value): the one that alone covers what is missing at the least expected
cost (its measured load seconds, supervise/loads.py, times its likelihood of reuse from its
last request), else the largest. Without measured loads that is the least recently used one
that covers.

Never a loop (issue 46 item 4): when X does not fit even with every idle model unloaded (the
router's memory, the models that are not idle and X's own claim pass the budget), nothing is
unloaded: X's child is killed in its frozen leaf (kernel/kill.py; it never allocates, the
router answers its request with an error) and ONE journal line names the numbers. Nothing
idle because the router did not answer: logged and journaled, X thawed (its leaf's max and
the pressure rules remain).

It runs in the model leaves' router thread, never in the placement thread (a child started
meanwhile is placed at once, supervise/models.py): each round's calls to the router (its
models, their slots, one unload) end within ROUND_S in all, and each unloaded child is waited
for at most WAIT_S, so X stays frozen at most (ROUND_S + WAIT_S) per model it could unload,
however the router stalls.

Standard library only (the run time's import set).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from governor.board.order import by_value
from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.kill import kill_tree
from governor.kernel.leafname import LeafNameError, model_cgroup, models_cgroup
from governor.log import get_logger
from governor.peer.router import RUNNING, RouterClient, RouterError, idle_lru
from governor.plan.router import ROUTER_OWN_BYTES
from governor.supervise.activity import Activity

if TYPE_CHECKING:
    from governor.rundir.journal import Journal

log = get_logger(__name__)

WAIT_S = 20.0  # for an unloaded model's child to exit (the router's stop-timeout: 10 s)
WAIT_POLL_S = 0.05
ROUND_S = 5.0  # one round's calls to the router: /models, each model's /slots, one unload
REASON = "memory"  # RunState.router unloads' reason, governor_model_unloads_total's


class Evictor:
    """Makes room for a new model by unloading idle ones (module docstring). ``claims``:
    alias -> its estimate (the estimate's "router" table); ``board_free``: the board's free
    budget for this slice now (None: unknown); ``on_unload(model, reason)`` counts one;
    ``reload_s``: alias -> its measured load seconds (None: not measured); ``cap``: what the budget
    an admission lowered this router to leaves its models now (rundir/cap.py; None: none)."""

    def __init__(
        self,
        fs: CgroupFs,
        *,
        group: str,
        leaf: str,
        client: RouterClient,
        activity: Activity,
        claims: Mapping[str, int],
        board_free: Callable[[], int | None] | None = None,
        journal: Journal | None = None,
        on_unload: Callable[[str, str], None] | None = None,
        before_unload: Callable[[str], object] | None = None,
        wait_s: float = WAIT_S,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        reload_s: Callable[[str], float | None] = lambda _alias: None,
        wall: Callable[[], float] = time.time,
        cap: Callable[[], int | None] | None = None,
    ) -> None:
        self.fs = fs
        self.cap = cap
        self.reload_s = reload_s
        self.wall = wall
        self.group = group
        self.leaf = leaf
        self.client = client
        self.activity = activity
        self.claims = dict(claims)
        self.board_free = board_free
        self.journal = journal
        self.on_unload = on_unload
        self.before_unload = before_unload  # its conversations saved (supervise/slots.py)
        self.wait_s = wait_s
        self.sleep = sleep
        self.clock = clock

    def cgroup(self, alias: str) -> str | None:
        """The model's leaf; None when its name maps to none (kernel/leafname.py: its child
        was left in the engine leaf, charged there)."""
        try:
            return model_cgroup(self.group, alias)
        except LeafNameError:
            return None

    def _read(self, cgroup: str, file: str) -> int | None:
        return self.fs.read_limit(cgroup, file)

    def budget(self) -> int | None:
        """The group's memory.max now, else the board's free budget, at most the budget an
        admission lowered it to (rundir/cap.py) while that tenant runs; None: none known."""
        own = self._own_budget()
        models = None
        if self.cap is not None:
            try:
                models = self.cap()
            except Exception as err:  # another process's file: never a crash
                log.warning("evict.cap_unreadable", error=str(err))
        if models is None:
            return own
        lowered = models + self.router_bytes()  # the cap bounds the models (rundir/cap.py)
        return lowered if own is None else min(own, lowered)

    def _own_budget(self) -> int | None:
        limit = self._read(self.group, kf.MEMORY_MAX)
        if limit is not None:
            return limit
        if self.board_free is None:
            return None
        try:
            return self.board_free()
        except Exception as err:  # the board's files are another process's: never a crash
            log.warning("evict.board_unreadable", error=str(err))
            return None

    def claim(self, alias: str) -> int:
        """A model's claim: its estimate, else its leaf's memory.max, else memory.current."""
        estimate = self.claims.get(alias)
        if estimate is not None:
            return estimate
        cg = self.cgroup(alias)
        if cg is None:
            return 0  # its child is in the engine leaf: counted with the router
        return self._read(cg, kf.MEMORY_MAX) or self._read(cg, kf.MEMORY_CURRENT) or 0

    def loaded(self, exclude: str) -> list[str]:
        """The models whose leaf holds a process now (a child that is exiting still holds its
        memory), ``exclude`` left out."""
        try:
            leaves = self.fs.children(models_cgroup(self.group))
        except GovernorError:
            return []
        out = []
        for cg in leaves:
            alias = self.activity.model_of(cg.rsplit("/", 1)[1])
            if alias == exclude:
                continue
            try:
                if self.fs.procs(cg):
                    out.append(alias)
            except GovernorError:
                continue
        return out

    def used(self, new: str) -> int:
        """The loaded models' claims + the router's own memory (its leaf's memory.current, else
        the figure the estimate counts: plan/router.py) + ``new``'s claim."""
        return sum(self.claim(a) for a in self.loaded(new)) + self.router_bytes() + self.claim(new)

    def router_bytes(self) -> int:
        """The router's own memory: its leaf's memory.current, else the estimate's figure."""
        return self._read(self.leaf, kf.MEMORY_CURRENT) or ROUTER_OWN_BYTES

    def over(self, new: str) -> tuple[int, int] | None:
        """(used, budget) when ``new`` does not fit, None when it does (or no budget)."""
        budget = self.budget()
        if budget is None:
            return None
        used = self.used(new)
        return (used, budget) if used > budget else None

    def by_value(self, idle: list[str], missing: int) -> list[str]:
        """``idle`` in the order they give way for ``missing`` bytes (module docstring)."""
        return by_value(
            idle, missing, frees=self.claim, now=self.wall(),
            cost=lambda a: (self.reload_s(a), self.activity.last.get(a)),
        )  # fmt: skip

    def make_room(self, new: str) -> list[str]:
        """Unload idle models, by value, until ``new`` fits, or refuse ``new`` at once when
        even all of them do not make room; the models unloaded. The caller froze ``new``'s
        leaf and thaws it afterwards, whatever this does."""
        unloaded: list[str] = []
        tried: set[str] = set()
        while (over := self.over(new)) is not None:
            used, budget = over
            client = self.client.within(ROUND_S)  # a stalled router ends the round in time
            statuses: dict[str, str] | None = None
            try:
                statuses = client.models()
                idle = idle_lru(
                    client, self.activity.last, exclude={new, *tried}, statuses=statuses
                )
            except RouterError as err:
                idle = []
                log.warning("evict.router_unreadable", error=str(err))
            # the probes of their slots are no requests: not dated as one (Activity.rebase)
            loaded = self.loaded(new)
            self.activity.rebase(loaded)
            log.info(
                "evict.idle", model=new, idle=idle, last=self.activity.last,
                reload_s={a: self.reload_s(a) for a in idle},
            )  # fmt: skip
            if statuses is not None and not unloaded:
                # what stays with every idle model gone: the running ones not idle (one the
                # router no longer runs is exiting: its memory leaves with it)
                stays = [a for a in loaded if statuses.get(a) in RUNNING and a not in idle]
                floor = used - sum(self.claim(a) for a in loaded if a not in stays)
                if floor > budget:
                    self._refuse(new, used, used - floor, budget)
                    break
            if not idle:
                self._nothing_idle(new, used, budget)
                break
            victim = self.by_value(idle, used - budget)[0]
            tried.add(victim)
            if self.before_unload is not None:
                self.before_unload(victim)
            if not client.unload(victim):
                continue  # refused (it got a request meanwhile, say): the next one
            asked = self.clock()
            gone = self._wait_gone(victim)
            log.info(
                "model.unloaded", model=victim, reason=f"room for {new}", used=used,
                budget=budget, exited=gone, waited_s=round(self.clock() - asked, 3),
            )  # fmt: skip
            self._journal(victim, f"room for {new}")
            if self.on_unload is not None:
                self.on_unload(victim, REASON)
            unloaded.append(victim)
        return unloaded

    def _wait_gone(self, alias: str) -> bool:
        """Until the model's leaf is not populated, at most ``wait_s``; True when it is not.
        Not cgroup.procs: an exiting child leaves it while its memory is still being freed
        (exit_mm comes before cgroup_exit, which unpopulates the leaf)."""
        deadline = self.clock() + self.wait_s
        cg = self.cgroup(alias)
        if cg is None:
            return True  # no leaf to watch: the router said it stops the child
        while True:
            try:
                if not self.fs.populated(cg):
                    return True
            except GovernorError:
                return True  # the leaf is gone
            if self.clock() >= deadline:
                log.warning("evict.unload_slow", model=alias, waited_s=self.wait_s)
                return False
            self.sleep(WAIT_POLL_S)

    def _refuse(self, new: str, used: int, freeable: int, budget: int) -> None:
        """``new`` cannot fit even with every idle model unloaded: its child is killed before
        it allocates (its leaf is frozen), one journal line says why (module docstring)."""
        mib = 1 << 20
        why = (
            f"{new} cannot fit: {used // mib} MiB of claims with it (its own"
            f" {self.claim(new) // mib} MiB), every idle model unloaded frees"
            f" {freeable // mib} MiB, over {budget // mib} MiB: stopped, nothing unloaded"
        )
        cg = self.cgroup(new)
        stopped = "; not stopped: it has no leaf"
        if cg is not None:
            try:
                how = kill_tree(self.fs, cg)
                stopped = "" if how is None else f" ({how})"
            except GovernorError as err:
                stopped = f"; could not stop it: {err}"
        log.warning(
            "evict.cannot_fit", model=new, used=used, freeable=freeable, budget=budget,
            stopped=stopped or "killed",
        )  # fmt: skip
        if self.journal is not None:
            try:
                self.journal.append("unload", [], model=new, error=why + stopped)
            except OSError as err:
                log.warning("evict.journal_failed", error=str(err))

    def _nothing_idle(self, new: str, used: int, budget: int) -> None:
        mib = 1 << 20
        why = (
            f"no idle model to unload for {new}: {used // mib} MiB of claims"
            f" over {budget // mib} MiB"
        )
        log.warning("evict.nothing_idle", model=new, used=used, budget=budget)
        if self.journal is not None:
            try:
                self.journal.append("unload", [], model=new, error=why)
            except OSError as err:
                log.warning("evict.journal_failed", error=str(err))

    def _journal(self, model: str, reason: str) -> None:
        if self.journal is None:
            return
        try:
            self.journal.append("unload", [], model=model, reason=reason)
        except OSError as err:
            log.warning("evict.journal_failed", error=str(err))
