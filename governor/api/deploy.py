"""`governor install` and `governor uninstall` in the composition root (governor/deploy/)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from governor.api.admit import Admitted, admission, say_now
from governor.api.host import HostOptions, compile_policy, load_policy, probe_host
from governor.api.launch import LaunchOptions, compiled_for_launch
from governor.backends.systemd import daemon_reload
from governor.board.budget import plan_claim_dict
from governor.cache.store import cache_dir
from governor.deploy import dropin
from governor.deploy import install as inst
from governor.engines.preflight import engine_args
from governor.engines.preflight import model_bytes as model_size
from governor.errors import GovernorError, HostError
from governor.log import get_logger
from governor.plan.host import HostFacts
from governor.plan.model import Plan
from governor.plan.unitmap import service_unit
from governor.policy.model import Policy
from governor.record import record
from governor.rundir.state import run_dir


@record(frozen=True)
class InstallOptions:
    root: Path = Path("/")  # where etc/systemd/system is written (a DESTDIR)
    dry_run: bool = False
    engine: tuple[str, ...] = ()  # engine argv for the instance's ExecStart= (optional)
    governor: str | None = None  # governor executable in ExecStart= (default: this one)
    force: bool = False  # install even when the board cannot admit it (issue 36)


def _governor_executable() -> str:
    beside = Path(sys.executable).with_name("governor")  # the venv's console script
    if beside.exists():
        return str(beside)
    return shutil.which("governor") or "/usr/local/bin/governor"


def _model_bytes(policy: Policy, engine: tuple[str, ...]) -> int | None:
    """The model's size from the instance's engine argv (None without one)."""
    if not engine:
        return None
    args = engine_args(
        policy.engine.kind,
        policy.engine.max_context_tokens,
        engine,
        max_cache_ram=policy.engine.max_cache_ram,
        env=policy.process.env,  # the service's environment beyond the unit's own
    )
    return model_size(args)


def _systemd_host(opts: HostOptions) -> tuple[HostFacts, int]:
    """The probed host and its systemd's version: systemd must be PID 1 (it enables
    controllers along the unit's path itself)."""
    host = probe_host(opts)
    if host.systemd_version is None:
        raise HostError(
            f"systemd is not PID 1 on the probed host ({host.root}/proc/1/comm: {host.pid1!r})",
            hint="install on the board itself, or render for it with --root of the global"
            " options pointing at a copy of its /proc and /sys",
        )
    return host, host.systemd_version


def install(path: Path, opts: HostOptions, iopts: InstallOptions) -> inst.Result:
    """`governor install`: render the policy's units for this host's systemd and write them."""
    policy = load_policy(path)
    model_bytes = _model_bytes(policy, iopts.engine)
    host, version = _systemd_host(opts)
    plan = compile_policy(policy, host, opts, path, model_bytes=model_bytes)
    files = dropin.render_install(
        plan,
        version,
        policy_path=str(path.resolve()),
        governor=iopts.governor or _governor_executable(),
        engine=iopts.engine or None,
    )
    live = iopts.root.resolve() == Path("/")
    said: list[str] = []  # the admission's warning, said once the install is done
    admitted = admit_install(plan, opts, iopts, live=live, say=said.append)  # 75: no write
    try:
        result = inst.install(
            plan.policy,
            files,
            dropin.unit_names(plan),
            root=iopts.root,
            dry_run=iopts.dry_run,
            reload=daemon_reload if live else None,
            claim=plan_claim_dict(plan),
        )
    finally:
        admitted.release()  # the manifest (the claim) is written: the next one reads it
    for line in said:
        say_now(line)
    if live and not iopts.dry_run and iopts.engine:
        _precompile_for_service(path.resolve(), iopts.engine, opts)
    return result


def admit_install(
    plan: Plan,
    opts: HostOptions,
    iopts: InstallOptions,
    *,
    live: bool,
    say: Callable[[str], None] | None = None,
) -> Admitted:
    """The board's admission of the installed slice (governor/api/admit.py): against what
    runs here (a live install) and what is installed under the install root. Nothing starts
    now: "wait" and "shed" say what the start will do; the guarantees are checked all the
    same. Returns the admission, holding the board lock until the manifest is written."""
    run = None
    if live:
        try:
            run = run_dir()
        except HostError:
            run = None  # no run directory: nothing runs under governor here
    return admission(
        plan,
        run=run,
        root=opts.root,
        force=iopts.force,
        act=False,
        install_root=iopts.root,
        say=say,
    )


def _precompile_for_service(policy_path: Path, engine: tuple[str, ...], opts: HostOptions) -> None:
    """Compile the plan the installed service will ask for (its ExecStart= command line, its
    working directory /, root's cache) so that `systemctl start` takes the lean path. Best
    effort: a refusal here is said now and again by the service when it starts."""
    service_opts = HostOptions(
        root=opts.root, cgroup_root=opts.cgroup_root, sysfs_root=opts.sysfs_root
    )
    try:
        compiled_for_launch(
            policy_path,
            engine,
            service_opts,
            LaunchOptions(backend="systemd"),
            "systemd",
            cwd=Path("/"),
            cache=cache_dir(environ={}),
        )
    except GovernorError as err:
        get_logger("governor.install").warning(
            "plan.precompile_failed", message=str(err), hint=err.hint
        )


def uninstall(policy: str, root: Path, *, dry_run: bool = False) -> inst.Result:
    """`governor uninstall`: remove what install wrote for a policy (a file or its name) and
    restore the files it replaced."""
    name = load_policy(Path(policy)).name if policy.endswith(".toml") else policy
    live = root.resolve() == Path("/")
    result = inst.uninstall(
        name, root=root, dry_run=dry_run, reload=daemon_reload if live else None
    )
    if live and not dry_run:
        _stop_policy_slices(name, result.units)
    return result


def _stop_policy_slices(name: str, units: list[str]) -> None:
    """A slice unit stays active (its cgroup too) after its file is gone: stop the policy's
    slice once nothing runs in it, so uninstall leaves no cgroup behind. A governor@ service
    still running keeps it (it runs in that slice; stop it first)."""

    def systemctl(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["systemctl", *argv], capture_output=True, text=True, timeout=120, check=False
        )

    try:
        if systemctl("is-active", "--quiet", service_unit(name)).returncode == 0:
            return
        for unit in units:
            if unit.endswith(".slice") and unit != "governor.slice":
                systemctl("stop", unit)
    except (OSError, subprocess.SubprocessError):
        pass  # no systemctl (a board rendered with --root): nothing is running there
