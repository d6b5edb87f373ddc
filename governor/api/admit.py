"""Admission against the board's budget (issue 36) in the composition root: `check
--engine-argv`, `launch`, `install` and the Ansible module ask :func:`admission` before
anything is applied.

The arithmetic is pure (governor/board/budget.py), the claims are gathered from what runs and
what is installed (governor/board/scan.py). This module adds what needs a clock, the board
lock and the shed: a refusal (75, nothing applied), the one warning line of an admitted
overlap, ``[qos] admit = "wait"`` (poll for room up to admit_timeout, saying who holds it) and
``"shed"`` (stop lower-class engines through the shed ladder, journaled as the admission's).

The board lock: ``<run dir>/board.lock`` (lockf), taken before the claims are read and held
until the new slice's state is published (the supervisor releases it: Job.board_release),
so two launches racing for the last room are decided one after the other: one starts, one
exits 75. It is taken against a deadline (governor/peer/lock.py): ``admit_timeout`` under
``admit = "wait"`` or ``"shed"``, else ``LOCK_WAIT_S``; `check --engine-argv` waits at most
``CHECK_LOCK_WAIT_S``. Still held then: 75, naming the holder (its pid, in the file). `check`
takes it too, though it only reads: its answer is the one a launch would get now, 75 included.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from governor.board import unloading
from governor.board.admission import POLL_S, Admitted, Unloader, Words, decide
from governor.board.budget import refusal_text, slice_of_plan
from governor.board.file import board_path, no_budget_error
from governor.board.npu import npu_refusal
from governor.board.scan import scan
from governor.errors import AdmissionRefused, HostError
from governor.kernel.cgroupfs import CgroupFs
from governor.log import get_logger
from governor.peer.files import CappedReadError
from governor.peer.lock import LockBusy, take
from governor.rundir.state import read_states

if TYPE_CHECKING:
    from governor.board.budget import Verdict
    from governor.board.scan import Board
    from governor.board.slice import Slice
    from governor.board.unload import Room, Unload
    from governor.plan.model import Plan

log = get_logger("governor.admit")

LOCK_FILE = "board.lock"
__all__ = ["POLL_S", "Admitted", "admission", "board_lock", "lock_wait", "npu_claims", "say_now"]
# how long the board lock is waited for (unless [qos] admit waits: its admit_timeout): the
# longest a holder keeps it is an install's daemon-reload or a launch's apply and start
LOCK_WAIT_S = 10.0
CHECK_LOCK_WAIT_S = 2.0  # `check --engine-argv`: a prediction, nothing waits on its answer
LOCK_HINT = (
    "another launch, install or check holds it while it weighs the board (a launch until its"
    " engine's state is published): try again once it is done; a process stopped with ^Z"
    " holds it until it is resumed or killed"
)
ADMIT_HINT = (
    "`governor status` lists what runs and holds the memory: stop one, lower this policy's"
    ' memory.min, set [qos] admit = "wait" or "shed", or --force admits it anyway'
)


def board_lock(
    run: Path,
    *,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    why: str = "",
) -> int:
    """The board lock's fd (lockf LOCK_EX, this process's pid in the file: governor/peer/lock.py);
    close it to release. Still held at ``deadline`` (on ``clock``): AdmissionRefused (75)
    naming the holder; ``why``: what could not be admitted, for that line. Not a regular file
    (a symlink, a FIFO): HostError (69). Other OSErrors (an unwritable run dir) pass."""
    run.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = run / LOCK_FILE
    try:
        return take(path, deadline=deadline, clock=clock, sleep=sleep)
    except LockBusy as busy:
        raise AdmissionRefused(
            f"{LOCK_FILE} held by {busy.holder} for {busy.waited:.3g}s{why} ({path})",
            hint=LOCK_HINT,
        ) from None
    except CappedReadError as err:
        raise HostError(
            f"the board lock is {err.problem} ({path})",
            hint="governor makes it a regular file: remove what is there and try again",
        ) from None


def lock_wait(plan: Plan, *, check: bool = False) -> float:
    """How long an admission of ``plan`` waits for the board lock (module docstring)."""
    wait = plan.qos.admit_timeout_s if plan.qos.admit in ("wait", "shed") else LOCK_WAIT_S
    return min(wait, CHECK_LOCK_WAIT_S) if check else wait


def _where(board: Path | None) -> str:
    return f"[qos] admit, {board if board is not None else board_path()}"


def _refuse(verdict: Verdict, board: Path | None, extra: str = "") -> AdmissionRefused:
    return AdmissionRefused(f"{refusal_text(verdict)}{extra} ({_where(board)})", hint=ADMIT_HINT)


def npu_claims(run: Path, root: Path, *, but: str = "") -> list[tuple[str, int]]:
    """(policy, NPU bytes) of each running RKLLM instance but ``but`` (its [device] memory);
    admission's and `init`'s (governor/init/rkllm.py) view of the NPU's address space."""
    return [
        (st.policy, st.plan.device.memory)
        for st in read_states(run, root / "proc")
        if not st.stale
        and st.policy != but
        and st.plan is not None
        and st.plan.engine.kind == "rkllm"
        and st.plan.device is not None
        and isinstance(st.plan.device.memory, int)
    ]


def npu_admission(plan: Plan, run: Path, root: Path) -> None:
    """AdmissionRefused (75) for an RKLLM engine whose NPU memory ([device] memory) does not
    fit the NPU's address space beside the running RKLLM instances' (governor/engines/
    rkllm_memory.py: rknn-llm issues 437 and 522)."""
    need = None if plan.device is None else plan.device.memory
    if plan.engine.kind != "rkllm" or not isinstance(need, int):
        return
    said = npu_refusal(plan.policy, need, npu_claims(run, root, but=plan.policy))
    if said is not None:
        raise AdmissionRefused(
            f"{said} (device.memory, {run})",
            hint="stop the other RKLLM engine first, or run a smaller model (device.memory is"
            " the .rkllm file's size unless set)",
        )


def say_now(line: str) -> None:
    """One ``governor: ...`` warning line on stderr."""
    sys.stderr.write(f"governor: {line}\n")
    sys.stderr.flush()


def admission(
    plan: Plan,
    *,
    run: Path | None,
    root: Path = Path("/"),
    estimate: int | None = None,
    force: bool = False,
    board: Path | None = None,
    hold: bool = True,
    act: bool = True,
    install_root: Path | None = None,
    gather: Callable[[], Board] | None = None,
    stop: Callable[[Plan, Slice], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] | None = None,
    lock_s: float | None = None,
    measured: tuple[int, int] | None = None,
    unloader: Unloader | None = None,
) -> Admitted:
    """Admit ``plan`` on the board or raise AdmissionRefused (75): the decision is
    governor/board/admission.py's, this wires it (where the board is read, the lock, the
    words). ``hold``: keep the board lock (launch: until the state is published; install:
    until its manifest is written); else it is released on return (check). ``act``: False
    where nothing starts now (check, install): "wait" and "shed" only say what the start will
    do, the guarantees of "warn" and "refuse" are refused all the same. ``run``: None for a
    board rendered elsewhere (no running claims, no lock). ``gather``, ``stop``, ``clock`` and
    ``sleep`` are the tests' doors; ``say``: where the warning lines go (default stderr, at
    once); ``lock_s``: how long the board lock is waited for (default :func:`lock_wait`);
    ``measured``: (peak, runs) earlier runs measured, claimed instead of the estimate;
    ``unloader``: a shed's unloads of lower-class routers' idle models (default: through
    each router and its run dir, board/unloading.py; the tests' door)."""

    def read() -> Board:
        if gather is not None:
            return gather()
        return scan(
            run=run,
            cgroup_root=Path(plan.cgroup_root),
            root=root,
            board=board,
            install_root=install_root,
        )

    if run is not None:
        npu_admission(plan, run, root)  # 75: RKLLM's NPU address space, shared by instances
    new = slice_of_plan(plan, estimate=estimate, measured=measured)
    why = f": the board cannot admit {new.name} now"
    lock: Callable[[float], int] | None = None
    if run is not None:
        lock_dir = run

        def lock(deadline: float) -> int:
            return board_lock(lock_dir, deadline=deadline, clock=clock, sleep=sleep, why=why)

    def unlocked(err: OSError) -> None:
        log.warning("admit.unlocked", run=str(run), reason=err.strerror)

    def stop_one(victim: Slice) -> None:
        (stop or _stop)(plan, victim)

    words = Words(
        refuse=lambda verdict, extra: _refuse(verdict, board, extra),
        no_budget=lambda text: no_budget_error(text, board if board is not None else board_path()),
        say=say or say_now,
    )
    # one deadline for the whole admission: the lock's wait and the room's share it ("wait"
    # and "shed" wait admit_timeout for the lock, then only what is left of it for room)
    started = clock()
    return decide(
        new, plan.qos, read=read, words=words, lock=lock,
        lock_deadline=started + (lock_wait(plan) if lock_s is None else lock_s),
        stop=stop_one, force=force, hold=hold, act=act, clock=clock, sleep=sleep,
        started=started, unlocked=unlocked,
        unloader=(
            unloader if unloader is not None or run is None
            else _unloader(plan, run, clock=clock, sleep=sleep)
        ),
    )  # fmt: skip


def _fs_of(plan: Plan) -> Callable[[Slice], CgroupFs]:
    def fs_of(s: Slice) -> CgroupFs:
        return CgroupFs(Path(s.cgroup_root or plan.cgroup_root))

    return fs_of


def router_rooms(plan: Plan) -> Callable[[list[Slice]], list[Room]]:
    """What the lower-class routers hold now (board/unloading.py rooms), as ``plan``'s
    admission reads them: a shed's unloads, and what `board --fits` says of them."""
    fs_of = _fs_of(plan)
    return lambda routers: unloading.rooms(routers, fs_of)


def _unloader(
    plan: Plan,
    run: Path,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Unloader:
    """Admission's unloads through each lower-class router and its run dir
    (board/unloading.py), on the admission's clock: the leaf wait after an unload ends by
    the admission's deadline."""

    def unload(u: Unload, deadline: float) -> None:
        unloading.apply(
            u, run=run, by=plan.policy, fs=_fs_of(plan)(u.router), clock=clock, sleep=sleep,
            deadline=deadline, timeout_s=plan.qos.admit_timeout_s,
        )  # fmt: skip

    return Unloader(
        rooms=router_rooms(plan),
        unload=unload,
        restore=lambda u: unloading.restore(u, run=run, by=plan.policy),
        text=lambda u: unloading.text(u, plan.policy),
    )


def _stop(plan: Plan, victim: Slice) -> None:
    """Stop one lower-class engine with the shed ladder's "stop" step (board/steps.py: SIGTERM
    to its published engine pid, thawed first), journaled in the victim's journal as a shed by
    this policy "when" its admission."""
    from governor.board.steps import stop  # noqa: PLC0415  # only when a victim is stopped

    failed = stop(
        CgroupFs(Path(plan.cgroup_root)), victim, by=plan.policy, when=f"admission of {plan.policy}"
    )
    if failed is not None:
        log.warning("admit.stop_failed", victim=victim.name, detail=failed)
