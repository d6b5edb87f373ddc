"""Admission's unload of a lower-class router's idle models (issue 46): what each router holds
now (:func:`rooms`, board/unload.py decides from it) and the unload itself (:func:`apply`,
:func:`restore`), through the router (peer/router.py) and its lowered budget (rundir/cap.py).

- **rooms**: every running lower-class router under ``[engine] evict = "memory"`` whose budget
  nobody lowered yet: GET /models and each running model's slots, within ROUND_S per router
  (a router that does not answer offers nothing: logged, never a wait). Its own memory is its
  engine leaf's memory.current (else the figure the estimate counts, plan/router.py), each
  model's claim is its estimate, else its leaf's memory.max, else its memory.current (the
  figures its evictor counts: supervise/evict.py ``used``, so the lowered budget is the one the
  evictor measures against);
- **apply**: the cap first (the router can load nothing over it from here on), then one
  POST /models/unload per model (all within ROUND_S a model and the admission's time left:
  none asked when none is left, the cap given back), then each unloaded model's leaf waited
  for to empty (at most WAIT_S: its child exits within the router's stop-timeout, and never
  past the admission's deadline: a leaf still busy then refuses the admission, 75, its budget
  given back); a model the router does not unload: the cap removed again and GovernorError
  (the admission refuses, 75: nothing half applied; a model already unloaded holds nothing, it
  loads again on demand);
- each unload is journaled in the router's journal as a shed step ``unload`` by the admitted
  policy, ``when`` its admission, with the budget it lowered.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from governor.board.budget import gib
from governor.board.slice import Slice
from governor.board.steps import journal, locked
from governor.board.unload import Model, Room, Unload
from governor.errors import GovernorError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import LeafNameError, model_cgroup
from governor.log import get_logger
from governor.peer.router import FRESH_S, RUNNING, RouterClient, RouterError, idle_lru
from governor.plan.model import ShedStep
from governor.plan.router import ROUTER_OWN_BYTES
from governor.rundir import cap as caps
from governor.rundir.liveness import own_start

log = get_logger("governor.admit")

ROUND_S = 5.0  # one router's calls while admission weighs it: /models and each model's slots
WAIT_S = 20.0  # for an unloaded model's child to exit (the router's stop-timeout: 10 s)
WAIT_POLL_S = 0.05

Client = Callable[[str], RouterClient]  # url -> a client (the tests' door)


def _leaf(group: str, alias: str) -> str | None:
    try:
        return model_cgroup(group, alias)
    except LeafNameError:
        return None


def model_claim(fs: CgroupFs, r: Slice, alias: str) -> int:
    """A model's claim as its evictor counts it: its estimate, else its leaf's memory.max,
    else memory.current (0: no leaf, its child is counted with the router)."""
    est = (r.model_claims or {}).get(alias)
    if est is not None:
        return est
    cg = _leaf(r.cgroup, alias)
    if cg is None:
        return 0
    return fs.read_limit(cg, kf.MEMORY_MAX) or fs.read_limit(cg, kf.MEMORY_CURRENT) or 0


def room(r: Slice, fs: CgroupFs, client: RouterClient) -> Room | None:
    """What the router ``r`` holds now, split (module docstring); None when it does not say."""
    last = r.router_last or {}
    try:
        statuses = client.models()
        idle = idle_lru(client, last, statuses=statuses, fresh_s=FRESH_S)
    except RouterError as err:
        log.warning("admit.router_unreadable", router=r.name, error=str(err))
        return None
    loaded = [a for a, st in sorted(statuses.items()) if st in RUNNING]
    own = (fs.read_limit(r.leaf, kf.MEMORY_CURRENT) if r.leaf else None) or ROUTER_OWN_BYTES
    busy = sum(model_claim(fs, r, a) for a in loaded if a not in idle)
    models = tuple(
        Model(
            alias=a,
            size=model_claim(fs, r, a),
            reload_s=(r.model_load_s or {}).get(a),
            last=last.get(a),
        )
        for a in idle
    )
    return Room(router=r, own=own, busy=busy, idle=models)


def rooms(
    lower: Iterable[Slice], fs_of: Callable[[Slice], CgroupFs], client: Client = RouterClient
) -> list[Room]:
    """A room per running lower-class router whose evictor can hold a lowered budget."""
    out = []
    for r in lower:
        if not (r.evicts and r.router_url and r.state == "running" and r.capped_by is None):
            continue
        got = room(r, fs_of(r), client(r.router_url).within(ROUND_S))
        if got is not None:
            out.append(got)
    return out


def text(u: Unload, by: str) -> str:
    """``unloaded m1, m2 from router R (a lower class), R's budget 1200 MiB -> 800 MiB until
    chat ends``."""
    r = u.router.name
    return (
        f"unloaded {', '.join(u.models)} from router {r} (a lower class), {r}'s budget"
        f" {gib(u.before)} -> {gib(u.budget)} until {by} ends"
    )


def apply(
    u: Unload,
    *,
    run: Path,
    by: str,
    fs: CgroupFs,
    client: Client = RouterClient,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
    wait_s: float = WAIT_S,
    deadline: float | None = None,
    timeout_s: float | None = None,
) -> None:
    """Lower ``u.router``'s budget, then unload its models (module docstring); GovernorError
    with the cap given back when the router does not take one, or when an unloaded model's
    leaf still holds its child at ``deadline`` (on ``clock``: the admission's, its
    ``admit_timeout`` ``timeout_s``), which bounds the leaf wait as ``wait_s`` does."""
    r = u.router
    directory = run / r.name
    pid = os.getpid()
    cap = caps.Cap(
        by=by, pid=pid, pid_start=own_start(), budget=u.budget, own=u.own, before=u.before,
        models=u.models, at=wall(),
    )  # fmt: skip
    try:
        caps.write(directory, cap)
    except OSError as err:
        raise GovernorError(
            f"{r.name}'s budget could not be lowered: {err.strerror} ({directory / caps.CAP_FILE})"
        ) from None
    assert r.router_url is not None  # rooms() offers routers only
    budget_s = ROUND_S * max(1, len(u.models))
    if deadline is not None:  # the unload calls end by the admission's deadline too
        budget_s = min(budget_s, deadline - clock())
        if budget_s <= 0:
            caps.remove(directory, by, pid)
            raise GovernorError(
                f"{r.name}'s unload of {', '.join(u.models)} was not asked: the admission's"
                f" time{_of(timeout_s)} ran out; {r.name}'s budget is given back ({directory / caps.CAP_FILE})"
            )
    router = client(r.router_url).within(budget_s)
    for alias in u.models:
        if not router.unload(alias):
            caps.remove(directory, by, pid)
            raise GovernorError(
                f"router {r.name} did not unload {alias} ({r.router_url}); its budget is given"
                f" back ({directory / caps.CAP_FILE})"
            )
        with locked(r):
            journal(
                r, ShedStep.UNLOAD, [], by=by, pid=pid, when=f"admission of {by}", model=alias,
                pid_start=cap.pid_start,
                reason=f"{r.name}'s budget {gib(u.before)} -> {gib(u.budget)} until {by} ends",
            )  # fmt: skip
        log.warning("shed.step", by=by, rule=-1, when=f"admission of {by}", victim=r.name,
                    step=ShedStep.UNLOAD, model=alias, budget=u.budget)  # fmt: skip
    began = clock()
    until = began + wait_s
    bound = until if deadline is None else min(until, deadline)
    for alias in u.models:
        cg = _leaf(r.cgroup, alias)
        while cg is not None and _holds(fs, cg):
            now = clock()
            if now >= bound and bound < until:  # the admission's deadline comes first
                caps.remove(directory, by, pid)
                raise GovernorError(
                    f"{_late(r.name, alias, now - began, bound - began, timeout_s)}"
                    f" ({directory / caps.CAP_FILE})"
                )
            if now >= bound:
                log.warning("admit.unload_slow", router=r.name, model=alias, waited_s=wait_s)
                break
            sleep(min(WAIT_POLL_S, bound - now))


def _of(timeout_s: float | None) -> str:
    """`` of admit_timeout 5 s`` (empty when the admission's timeout is not known)."""
    return "" if timeout_s is None else f" of admit_timeout {timeout_s:g} s"


def _late(router: str, alias: str, waited: float, left: float, timeout_s: float | None) -> str:
    """``router's model a still ran in its leaf 2.0 s after its unload, the admission's
    1.5 s left of admit_timeout 5 s ran out; router's budget is given back``."""
    return (
        f"{router}'s model {alias} still ran in its leaf {waited:.1f} s after its unload, the"
        f" admission's {max(0.0, left):.1f} s left{_of(timeout_s)} ran out; {router}'s budget is given back"
    )


def restore(u: Unload, *, run: Path, by: str) -> None:
    """Give ``u.router``'s budget back (an admission that fails after its unloads)."""
    caps.remove(run / u.router.name, by, os.getpid())


def _holds(fs: CgroupFs, cg: str) -> bool:
    """The leaf still populated: its child exiting leaves cgroup.procs before its memory is
    freed (supervise/leaving.py), the room comes with cgroup.events."""
    try:
        return fs.populated(cg)
    except GovernorError:
        return False
