"""Operating a live board, in the composition root: `status`, `diff`, `tune`, `rollback`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.api.host import HostOptions, compile_policy, load_policy, probe_host

if TYPE_CHECKING:
    from governor.rundir.state import RunState


def diff(path: Path, opts: HostOptions, *, install_root: Path = Path("/")) -> dict[str, Any]:
    """`governor diff`: compiled on this host vs the kernel vs the installed unit files."""
    from governor.backends.cgroupfs import CgroupfsBackend
    from governor.deploy import dropin
    from governor.deploy import install as inst
    from governor.kernel.cgroupfs import CgroupFs
    from governor.kernel.files import MISSABLE
    from governor.operate import diff as d

    policy = load_policy(path)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    plan = compile_policy(
        policy, host, HostOptions(opts.root, opts.cgroup_root, MISSABLE, opts.sysfs_root), path
    )
    fs = CgroupFs(Path(plan.cgroup_root))
    observed = CgroupfsBackend(fs).observe(plan) if fs.exists(plan.group) else None
    rendered: dict[str, str] | None = None
    on_disk: dict[str, str | None] | None = None
    if host.systemd_version is not None and inst.manifest_path(install_root, plan.policy).exists():
        files = dropin.render_install(plan, host.systemd_version, policy_path=str(path.resolve()))
        rendered = {f.path: f.text for f in files}
        on_disk = {}
        for f in files:
            try:
                on_disk[f.path] = (install_root / f.path).read_text()
            except OSError:
                on_disk[f.path] = None
        # a `tune --persist` drop-in overrides the policy's values until rolled back: drift
        from governor.deploy.tunedropin import DROPIN_NAME
        from governor.plan.unitmap import policy_slice

        tuned = f"{dropin.UNIT_DIR}/{policy_slice(plan.slice, plan.policy)}.d/{DROPIN_NAME}"
        try:
            on_disk[tuned] = (install_root / tuned).read_text()
            rendered[tuned] = ""  # install renders none: the policy says nothing else
        except OSError:
            pass
    from governor.errors import GovernorError
    from governor.operate.clocks import drift
    from governor.rundir.state import run_dir

    try:
        running = d.launch_skipped(plan, run_dir())
    except GovernorError:
        running = set()  # no run directory: nothing can run it
    skipped = {name: "the --allow-missing it runs with" for name in running}
    skipped |= {name: "--allow-missing" for name in opts.allow_missing}
    return d.report(plan, host, observed, rendered, on_disk, clocks=drift(plan), skipped=skipped)


def _governed(name: str) -> RunState:
    """The published state of NAME (66 when none; 69 when its supervisor is gone)."""
    from governor.errors import HostError
    from governor.rundir.state import RunState, run_dir, states_of

    st = RunState.read(states_of(run_dir(), name, hint="`governor status` lists what runs")[0])
    if st.plan is None:
        from governor.errors import PolicyNotFound

        raise PolicyNotFound(
            f"the state of {name} has no plan ({run_dir() / name / 'state.json'})",
            hint="its supervisor rewrites it at its next change; else move the file away",
        )
    if st.stale:
        raise HostError(
            f"the supervisor of {name} is gone (stale state in {run_dir() / name})",
            hint="start it again (governor launch / systemctl start governor@NAME)",
        )
    return st


def tune(
    name: str,
    assignments: tuple[str, ...],
    *,
    dry_run: bool,
    force: bool,
    persist: bool = False,
    confirm: str | None = None,
) -> dict[str, Any]:
    """`governor tune`: validate KEY=VALUE as the policy would, guard, apply in stages, journal.
    Under systemd, slice-level knobs go through the manager (runtime properties). ``confirm``:
    a DURATION after which the change reverts unless confirmed (governor/operate/confirm.py); with no
    assignments, CONFIRM_NOW confirms the pending tunes."""
    import time

    from governor.errors import UsageError
    from governor.operate import confirm as c
    from governor.operate import tune as t
    from governor.rundir.journal import Journal
    from governor.rundir.state import run_dir

    st = _governed(name)
    journal = Journal(run_dir() / name)
    if not assignments:
        if confirm != CONFIRM_NOW:
            raise UsageError(
                "nothing to tune (KEY=VALUE, --confirm)",
                hint="governor tune NAME KEY=VALUE..., or `governor tune NAME --confirm` to keep"
                " a change made with --confirm DURATION",
            )
        kept = c.confirm(journal)
        return {"policy": name, "confirmed": [e["id"] for e in kept], "changes": []}
    seconds = _confirm_seconds(confirm)
    routes, plan_slice, version, values = _routes(st, name, t.parse_assignments(assignments))
    _guard(routes, journal, force=force, dry_run=dry_run)
    if dry_run:
        return {
            "policy": name,
            "dry_run": True,
            "changes": [
                {"file": f, "kernel": r.live[f], "new": v, "via": r.via}
                for r in routes
                for f, v in r.changes.items()
            ],
        }
    overrides = t.parse_assignments(assignments)
    out: dict[str, Any] = {"policy": name, "dry_run": False, "changes": []}
    extra: dict[str, Any] = {}
    saved = (
        _persist(
            st, name, overrides=overrides, values=values, plan_slice=plan_slice, version=version
        )
        if persist
        else None
    )
    before: str | None = None
    if saved is not None:
        before = saved.pop("before", None)
        out["persisted"] = saved
        if saved.get("dropin"):
            extra["dropin"] = saved["dropin"]
    reverter = None
    if seconds is not None and any(r.changes for r in routes):
        deadline = round(time.time() + seconds, 3)
        reverter = c.Reverter(run_dir(), name, st.plan["cgroup_root"], deadline)
        extra.update(confirm_by=deadline, reverter_pid=reverter.pid)
        if reverter.unit is not None:
            extra["reverter_unit"] = reverter.unit  # its own scope: survives a logout
    try:
        ids = _apply_routes(routes, journal, extra, reverter, out["changes"])
    except BaseException:
        if saved is not None and before is not None:  # nothing half-applied: the file too
            import os

            from governor.deploy.tunedropin import write_atomic

            write_atomic(saved["file"], before, os.stat(saved["file"]).st_mode & 0o7777)
        raise
    if reverter is not None:
        reverter.go(ids)
        out["confirm_by"] = extra["confirm_by"]
    if ids:
        out["id"] = ids[-1]
    return out


def _confirm_seconds(confirm: str | None) -> float | None:
    """--confirm DURATION as seconds (None: no --confirm); PolicyError (65) for a bad one."""
    from governor.errors import PolicyError
    from governor.policy.durations import parse_seconds

    if confirm is None:
        return None
    try:
        return parse_seconds("" if confirm == CONFIRM_NOW else confirm)
    except ValueError:
        raise PolicyError(
            f"bad --confirm duration {confirm if confirm != CONFIRM_NOW else ''!r}",
            field="--confirm",
            hint="e.g. --confirm 5m (s, m, h); `governor tune NAME --confirm` alone keeps"
            " the pending change",
        ) from None


def _guard(routes: list[_Route], journal: Any, *, force: bool, dry_run: bool) -> None:
    """The guards against the live groups (tune.check_guards); a refusal is journaled, a fact
    about the slice (governor_tunes_total{refused}), unless it was a dry run."""
    from governor.errors import PolicyError
    from governor.operate import tune as t

    try:
        for r in routes:
            t.check_guards(r.fs, r.group, r.changes, force=force)
    except PolicyError as err:
        if not dry_run:
            _journal_failure(journal, "tune-refused", routes, err)
        raise


def _apply_routes(
    routes: list[_Route],
    journal: Any,
    extra: dict[str, Any],
    reverter: Any,
    changes: list[Any],
) -> list[int]:
    """Apply each route (one journal entry each; ``changes`` collects what they changed) and
    return the entry ids. All or nothing: a failure undoes the routes already applied (or the
    persisted drop-in), cancels the reverter and journals an OOM revert."""
    from governor.deploy import tunedropin
    from governor.operate import tune as t

    fs = routes[0].fs if routes else None
    ids: list[int] = []
    try:
        for r in routes:
            if not r.changes:
                continue
            entry = t.apply(
                r.fs, r.group, r.changes, journal=journal, write=r.write, unit=r.unit, extra=extra
            )
            ids.append(entry["id"])
            changes += entry["changes"]
        if not ids and extra.get("dropin"):
            ids.append(journal.append("tune", [], **extra)["id"])
    except BaseException as err:
        if reverter is not None:
            reverter.cancel()
        if isinstance(err, t.OomReverted):
            _journal_failure(journal, "tune-reverted", routes, err)
        if ids:  # an earlier route was applied: undo it, nothing half-applied
            t.rollback(fs, journal, ids=ids, reason="a later write failed")  # type: ignore[arg-type]
        elif extra.get("dropin"):
            tunedropin.restore_dropin(extra["dropin"])
        raise
    return ids


def _journal_failure(journal: Any, source: str, routes: list[_Route], err: Exception) -> None:
    """A tune that changed nothing in the end: refused by a guard, or reverted after an OOM
    kill. Journaled without changes (rollback and the monitor skip it; status and the
    governor_tunes_total{result} counter show it)."""
    import contextlib

    from governor.errors import one_line

    asked = [{"file": f, "new": v} for r in routes for f, v in r.changes.items()]
    with contextlib.suppress(OSError):
        journal.append(source, [], asked=asked, error=one_line(str(err)))


CONFIRM_NOW = "now"  # the value of a bare --confirm (typer flag_value)


class _Route:
    """The files of one tune that go to one group the same way (cgroupfs or the manager)."""

    def __init__(self, fs: Any, group: str, write: Any, unit: dict[str, Any] | None) -> None:
        self.fs, self.group, self.write, self.unit = fs, group, write, unit
        self.via = "systemd" if unit else "cgroupfs"
        self.changes: dict[str, str] = {}
        self.live: dict[str, str] = {}


def _routes(
    st: RunState, name: str, overrides: dict[tuple[str, str], object]
) -> tuple[list[_Route], str, int | None, dict[str, str]]:
    """Validate the overrides by recompiling the running policy with them, and sort the files
    that change by where they go: under systemd the unit carrying the limits (through the
    manager) or the engine leaf (what systemd cannot express); else the policy's group."""
    from governor.backends import manager
    from governor.compile.compiler import Workload, compile_plan
    from governor.errors import HostError
    from governor.kernel.cgroupfs import CgroupFs
    from governor.kernel.files import MISSABLE
    from governor.operate import tune as t
    from governor.plan.host import probe
    from governor.plan.model import Plan
    from governor.policy.loader import load
    from governor.rundir.state import run_dir

    running = Plan.from_dict(st.plan)
    path = st.policy_path or running.source
    if not path:
        raise HostError(
            f"the state of {name} names no policy file ({run_dir() / name})",
            hint="launch it again",
        )
    from governor.policy.clocks import ClocksSection

    # tune changes cgroup files only; the running plan's clocks stay as they were set
    policy = load(path, overrides=overrides).model_copy(update={"clocks": ClocksSection()})
    host = probe(cgroup_root=running.cgroup_root, target=running.group)
    model = st.model_bytes
    new = compile_plan(
        policy,
        host,
        workload=Workload(model_bytes=model) if model else None,
        allow_missing=MISSABLE,
        source=str(path),
    )
    fs = CgroupFs(Path(running.cgroup_root))
    plain = _Route(fs, running.group, None, None)
    via_manager = None
    version = host.systemd_version
    if st.backend == "systemd":
        if version is None:
            raise HostError(
                f"{name} runs under systemd, but systemd is not PID 1 here (/proc/1)",
                hint="tune it where its service runs",
            )
        unit, cgroup = manager.limits_unit(running.slice)
        via_manager = _Route(
            fs, cgroup, manager.ManagerWriter(fs, unit, cgroup, version),
            {"unit": unit, "systemd": version},
        )  # fmt: skip
    values: dict[str, str] = {}
    for section, field_ in overrides:
        key = f"{section}.{field_}"
        file = t.TUNABLE[key][2]
        value = next(
            (w.value for w in new.writes if w.file == file and w.cgroup == new.group), None
        )
        if value is None:
            raise HostError(
                f"cannot tune {key}: its controller is not enabled here ({file})",
                hint="governor doctor says what this host supports",
            )
        values[file] = value
        route = plain
        if via_manager is not None and manager.managed(file, value, version or 0):
            route = via_manager
        live = fs.read(route.group, file).strip()
        if live != value:
            route.changes[file] = value
            route.live[file] = live
    return [r for r in (via_manager, plain) if r is not None], new.slice, version, values


def _persist(
    st: RunState,
    name: str,
    *,
    overrides: dict[tuple[str, str], object],
    values: dict[str, str],
    plan_slice: str,
    version: int | None,
) -> dict[str, Any]:
    """--persist: an installed policy (governor install) gets a drop-in on its slice unit, so
    the manager keeps the values across daemon-reload, restarts and reboots; any other policy
    gets its file rewritten (comments and layout kept). The diff is returned either way."""
    from governor.backends import manager
    from governor.backends.systemd import daemon_reload
    from governor.deploy import install as inst
    from governor.deploy import tunedropin
    from governor.deploy.dropin import UNIT_DIR
    from governor.errors import HostError, PermissionDenied
    from governor.operate import tune as t
    from governor.plan import unitmap
    from governor.plan.model import Plan

    running = Plan.from_dict(st.plan)
    path = str(st.policy_path or running.source)
    installed = inst.manifest_path(Path("/"), name).exists()
    try:
        if not installed or version is None:
            with open(path) as f:  # as t.persist reads it
                before = f.read()
            diff = t.persist(path, overrides)
            # "before": what tune() writes back when the change then fails (popped there)
            return {"file": path, "diff": diff, "installed": installed, "before": before}
        unit = unitmap.policy_slice(plan_slice, name)
        settings: dict[str, str] = {}
        for section, field_ in overrides:
            file = t.TUNABLE[f"{section}.{field_}"][2]
            value = values[file]
            m = manager.managed(file, value, version)
            if m is None or m.directive is None:
                raise HostError(
                    f"cannot persist {section}.{field_} into a systemd drop-in: systemd"
                    f" {version} has no directive for {file} = {value} (--persist)",
                    hint="change the policy file and run `governor install` again",
                )
            settings[m.directive] = m.ini(value)
        target = f"/{UNIT_DIR}/{unit}.d/{tunedropin.DROPIN_NAME}"
        saved = tunedropin.persist_dropin(target, "Slice", settings)
    except PermissionError as err:
        raise PermissionDenied(
            "cannot write the persisted value", file=path, errno=err.errno, hint="run as root"
        ) from err
    daemon_reload()
    return {
        "file": target,
        "diff": saved["diff"],
        "installed": True,
        "dropin": {"path": target, "before": saved["before"]},
    }


def rollback(name: str, *, to: int | None, everything: bool) -> dict[str, Any]:
    """`governor rollback`: undo the last tune (or back to an entry, or all) from the journal."""
    from governor.deploy import tunedropin
    from governor.errors import PolicyError, PolicyNotFound
    from governor.kernel.cgroupfs import CgroupFs
    from governor.operate import tune as t
    from governor.plan.model import Plan
    from governor.rundir.journal import Journal
    from governor.rundir.state import run_dir

    st = _governed(name)
    running = Plan.from_dict(st.plan)
    journal = Journal(run_dir() / name)
    try:
        with journal.locked():  # not while the --confirm reverter decides
            return t.rollback(
                CgroupFs(Path(running.cgroup_root)),
                journal,
                to=to,
                everything=everything,
                restore_file=tunedropin.restore_dropin,
            )
    except t.NothingToRollBack as err:
        # no journal entry to act on: the input is missing (66), the policy is not invalid
        left = (
            f"no change after journal entry {to}"
            if to is not None
            else "no change left to undo"
            if everything
            else "no tune left to undo"
        )
        raise PolicyNotFound(
            f"nothing to roll back for {name}: {left} ({journal.path})",
            hint=f"`governor status {name}` shows the journal; without --all only `governor"
            " tune` changes are undone (--all also undoes the monitor's actions)",
        ) from err
    except ValueError as err:
        raise PolicyError(f"{err} for {name} ({run_dir() / name / 'journal.jsonl'})") from err


def status(name: str | None, *, prune: bool = False) -> list[dict[str, Any]]:
    """`governor status`: governor/operate/status.py over the published states; ``prune``
    first removes the published state of stale entries (their supervisor is gone), one
    `pruned NAME` line each on stderr."""
    import sys

    from governor.operate.status import collect, ledger_lines
    from governor.rundir.state import prune_stale, run_dir, scan_states

    if prune:
        pruned = prune_stale(run_dir(), name)
        for policy, pid in pruned:
            sys.stderr.write(f"pruned {policy}: its supervisor (pid {pid}) is gone\n")
        if name is not None and pruned and not collect_names(run_dir(), name):
            return []  # NAME was only that stale entry
    items = collect(run_dir(), name)
    # a state file that is not one hides nothing else: one line for it, the others shown
    for err in scan_states(run_dir())[1]:
        if name is None:
            sys.stderr.write(f"governor: skipped a state that is not one: {err}\n")
    if name is None:
        for line in ledger_lines(run_dir(), items):
            sys.stderr.write(f"governor: {line}\n")
    return items


def collect_names(directory: Path, name: str) -> bool:
    """Whether NAME still has a published state."""
    from governor.rundir.state import read_states

    return any(s.get("policy") == name for s in read_states(directory))


def metrics(textfile: Path | None, name: str | None) -> Path | bytes:
    """`governor metrics`: the exposition of the governed slices, written to
    ``textfile/governor.prom`` (atomically) or returned."""
    from governor.metrics.export import exposition, write_textfile
    from governor.rundir.state import run_dir

    if textfile is not None:
        return write_textfile(textfile, run_dir(), name)
    return exposition(run_dir(), name)
