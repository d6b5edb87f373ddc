"""`governor board` in the composition root (issue 36): the gatherer's claims
(governor/board/scan.py), the big ungoverned cgroups and `--fits POLICY -- ENGINE...`
(the policy compiled as `check --engine-argv` would, weighed by governor/board/budget.py's
admit(); nothing is applied, no lock is taken)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.api.admit import router_rooms
from governor.api.host import HostOptions, check, preflight_engine, probe_host
from governor.board.budget import slice_of_plan
from governor.board.file import read_board
from governor.board.scan import scan as gather
from governor.init.board import Tenants
from governor.kernel.cgroupfs import CgroupFs
from governor.operate import boardview
from governor.operate.boardview import fits as weigh
from governor.rundir.state import run_dir
from governor.state.peaks import learned, peak_key
from governor.state.store import state_dir

if TYPE_CHECKING:
    from governor.board.scan import Board
    from governor.init.board import Tenants

DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_root(opts: HostOptions) -> Path:
    if opts.cgroup_root is not None:
        return opts.cgroup_root
    mount = probe_host(opts).cgroup_mount
    return Path(mount) if mount is not None else opts.root / "sys/fs/cgroup"


def claims(opts: HostOptions, cgroup: Path | None = None) -> Board:

    return gather(run=run_dir(), cgroup_root=cgroup or cgroup_root(opts), root=opts.root)


def view(opts: HostOptions) -> dict[str, Any]:
    """`governor board --json`: governor/operate/boardview.py's view of the board now."""

    cg = cgroup_root(opts)
    seen = claims(opts, cg)
    others = boardview.ungoverned(CgroupFs(cg), seen.slices, read_board().entries)
    return boardview.view(seen.budget, seen.slices, others, seen.notes, seen.no_budget)


def fits(path: Path, engine: tuple[str, ...], opts: HostOptions) -> dict[str, Any]:
    """`governor board --fits POLICY [-- ENGINE...]`: the verdict for POLICY (when ENGINE is
    given, the peak earlier governed runs of its model and argv measured as its peak, else its
    estimate: what launch's admission claims) beside the board's claims now."""

    estimate = None
    measured = None
    if engine:
        plan, _host, checked = preflight_engine(path, engine, opts, probe_target=True, force=False)
        if checked.estimate is not None:
            estimate = checked.estimate.total
            got, _note = learned(state_dir(), peak_key(checked.estimate.model, engine))
            measured = None if got is None else (got.peak, got.runs)
    else:
        plan = check(path, opts)
    seen = claims(opts, Path(plan.cgroup_root))
    new = slice_of_plan(plan, estimate=estimate, measured=measured)
    # a shed's unloads from what the lower-class routers hold now, as the start reads them
    return weigh(seen.budget, new, seen.slices, plan.qos.admit, router_rooms(plan))


def tenants(opts: HostOptions) -> Tenants | None:
    """What `init` sizes beside: the claims and the board file's reserve (None when the
    board cannot be read: init then sizes for an empty board, as before issue 36)."""

    try:
        seen = claims(opts)
    except OSError:
        return None
    return Tenants(claims=seen.slices, reserve=read_board().reserve)
