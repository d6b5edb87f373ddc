"""`governor check` without --engine-argv in the composition root: the board file's check and
the warnings about the board a plan runs on. Apart from api/compile.py so that checking a
policy imports the compiler and the policy models but not the engines' estimate, the GGUF
reader or `init`'s drafts (tests/unit/cli/test_command_imports.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from governor.api.host import HostOptions, check
from governor.board.budget import Budget, no_budget_text
from governor.board.file import is_board_file, no_budget_error, read_board
from governor.board.scan import memtotal
from governor.compile.headroom import psi_shed_warning
from governor.kernel.procfs import ProcFs
from governor.monitor.victims import governed_groups
from governor.rundir.state import run_dir

if TYPE_CHECKING:
    from governor.plan.model import Plan


def shed_warnings(plan: Plan, opts: HostOptions) -> list[str]:
    """`check`'s warnings about the board the plan runs on (issue 43 item 14): a shed on PSI
    alone without (enough) swap (governor/compile/headroom.py)."""

    meminfo = ProcFs(opts.root / "proc").meminfo()
    if "MemTotal" not in meminfo:
        return []
    warning = psi_shed_warning(plan, meminfo.get("SwapTotal"), meminfo["MemTotal"])
    return [] if warning is None else [warning]


def check_board(path: Path, root: Path = Path("/")) -> int | None:
    """`governor check` of the board file (issue 23): the number of cgroups it lists, None
    when ``path`` is no board file (a policy). PolicyError (65) names the file and field; a
    ``[board] reserve`` that leaves no budget beside ``root``'s MemTotal is one too."""

    if not is_board_file(path):
        return None
    read = read_board(path, governed_slices(path.parent))
    if read.errors:
        raise read.errors[0]
    if read.reserve is not None:
        none = no_budget_text(Budget.of(memtotal(root), read.reserve))
        if none is not None:
            raise no_budget_error(none, path)
    return len(read.entries)


def governed_slices(policy_dir: Path) -> list[str]:
    """The groups a board entry may not be, contain or lie inside: every published plan's
    (the run dir) and every policy's in ``policy_dir`` (the board file's directory,
    /etc/governor): ``<slice>/<name>``."""

    out = set(governed_groups(run_dir()))
    try:
        files = sorted(policy_dir.glob("*.toml"))
    except OSError:
        files = []
    for f in files:
        try:
            raw = tomllib.loads(f.read_text())
        except (OSError, ValueError, RecursionError):
            continue  # not a policy: `governor check` of that file says why
        name, slice_ = raw.get("name"), raw.get("slice", "governor.slice")
        if isinstance(name, str) and isinstance(slice_, str) and name and slice_:
            out.add(f"{slice_}/{name}")
    return sorted(out)


def check_policy(path: Path, opts: HostOptions) -> tuple[Plan, list[str]]:
    """`governor check POLICY`: the plan compiled for this host (api/host.py check, as `plan`
    and `apply` compile it) and the warnings about the board it runs on."""

    plan = check(path, opts)
    return plan, shed_warnings(plan, opts)
