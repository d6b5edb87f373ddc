"""`governor diff` in the composition root: compiled on this host vs the kernel vs the
installed unit files (governor/operate/diff.py compares; this module reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from governor.api.host import HostOptions, compile_policy, load_policy, probe_host
from governor.backends.cgroupfs import CgroupfsBackend
from governor.deploy import dropin
from governor.deploy import install as inst
from governor.deploy.tunedropin import DROPIN_NAME
from governor.errors import GovernorError
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.files import MISSABLE
from governor.operate import diff as opdiff
from governor.operate.clocks import drift
from governor.plan.host import HostFacts
from governor.plan.model import Plan
from governor.plan.unitmap import policy_slice
from governor.rundir.state import run_dir


def _unit_files(
    plan: Plan, host: HostFacts, path: Path, install_root: Path
) -> tuple[dict[str, str] | None, dict[str, str | None] | None]:
    """(rendered, on disk) for an installed policy's unit files; (None, None) when it is not
    installed or systemd is not PID 1."""
    if host.systemd_version is None or not inst.manifest_path(install_root, plan.policy).exists():
        return None, None
    files = dropin.render_install(plan, host.systemd_version, policy_path=str(path.resolve()))
    rendered = {f.path: f.text for f in files}
    on_disk: dict[str, str | None] = {f.path: _read(install_root / f.path) for f in files}
    # a `tune --persist` drop-in overrides the policy's values until rolled back: drift
    tuned = f"{dropin.UNIT_DIR}/{policy_slice(plan.slice, plan.policy)}.d/{DROPIN_NAME}"
    text = _read(install_root / tuned)
    if text is not None:
        on_disk[tuned] = text
        rendered[tuned] = ""  # install renders none: the policy says nothing else
    return rendered, on_disk


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _skipped(plan: Plan, opts: HostOptions) -> dict[str, str]:
    """The missing controllers diff does not count: the run's --allow-missing and this one."""
    try:
        running = opdiff.launch_skipped(plan, run_dir())
    except GovernorError:
        running = set()  # no run directory: nothing can run it
    skipped = {name: "the --allow-missing it runs with" for name in running}
    return skipped | {name: "--allow-missing" for name in opts.allow_missing}


def diff(path: Path, opts: HostOptions, *, install_root: Path = Path("/")) -> dict[str, Any]:
    """`governor diff`: compiled on this host vs the kernel vs the installed unit files."""
    policy = load_policy(path)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    every = HostOptions(opts.root, opts.cgroup_root, MISSABLE, opts.sysfs_root)
    plan = compile_policy(policy, host, every, path)
    fs = CgroupFs(Path(plan.cgroup_root))
    observed = CgroupfsBackend(fs).observe(plan) if fs.exists(plan.group) else None
    rendered, on_disk = _unit_files(plan, host, path, install_root)
    return opdiff.report(
        plan, host, observed, rendered, on_disk, clocks=drift(plan), skipped=_skipped(plan, opts)
    )
