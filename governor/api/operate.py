"""Operating a live board, in the composition root: `status`, `diff`, `tune`, `rollback`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from governor.api import HostOptions, _compile, load_policy, probe_host


def diff(path: Path, opts: HostOptions, *, install_root: Path = Path("/")) -> dict[str, Any]:
    """`governor diff`: compiled on this host vs the kernel vs the installed unit files."""
    from governor import diff as d
    from governor import install as inst
    from governor.backends import dropin
    from governor.backends.cgroupfs import CgroupfsBackend
    from governor.kernel.cgroupfs import CgroupFs

    policy = load_policy(path)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    everything = frozenset({"memory", "cpu", "cpuset", "io", "pids", "psi"})
    plan = _compile(policy, host, HostOptions(opts.root, opts.cgroup_root, everything), path)
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
    return d.report(plan, host, observed, rendered, on_disk)


def _governed(name: str) -> dict[str, Any]:
    """The published state of NAME (66 when none; 69 when its supervisor is gone)."""
    from governor.errors import HostError, PolicyNotFound
    from governor.state import read_states, run_dir

    states = [s for s in read_states(run_dir()) if s.get("policy") == name]
    if not states:
        raise PolicyNotFound(
            f"no governed slice named {name} ({run_dir()})",
            hint="`governor status` lists what runs",
        )
    st = states[0]
    if st.get("stale"):
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
) -> dict[str, Any]:
    """`governor tune`: validate KEY=VALUE as the policy would, guard, apply in stages, journal."""
    from governor import tune as t
    from governor.errors import HostError
    from governor.journal import Journal
    from governor.kernel.cgroupfs import CgroupFs
    from governor.plan.compiler import Workload, compile_plan
    from governor.plan.host import probe
    from governor.plan.model import Plan
    from governor.policy.loader import load
    from governor.state import run_dir

    st = _governed(name)
    if st.get("backend") == "systemd":
        raise HostError(
            f"{name} runs under systemd: its slice's limits belong to the manager",
            hint="use `systemctl set-property --runtime` for now (tune through the manager is"
            " not built yet)",
        )
    overrides = t.parse_assignments(assignments)
    running = Plan.from_dict(st["plan"])
    path = st.get("policy_path") or running.source
    if not path:
        raise HostError(f"the state of {name} names no policy file", hint="launch it again")
    policy = load(path, overrides=overrides)
    host = probe(cgroup_root=running.cgroup_root, target=running.group)
    everything = frozenset({"memory", "cpu", "cpuset", "io", "pids", "psi"})
    model = st.get("model_bytes")
    new = compile_plan(
        policy,
        host,
        workload=Workload(model_bytes=model) if model else None,
        allow_missing=everything,
        source=str(path),
    )
    fs = CgroupFs(Path(running.cgroup_root))
    changes: dict[str, str] = {}
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
        if fs.read(running.group, file).strip() != value:
            changes[file] = value
    t.check_guards(fs, running.group, changes, force=force)
    live = {f: fs.read(running.group, f).strip() for f in changes}
    if dry_run:
        return {
            "policy": name,
            "dry_run": True,
            "changes": [{"file": f, "kernel": live[f], "new": v} for f, v in changes.items()],
        }
    out: dict[str, Any] = {"policy": name, "dry_run": False, "changes": []}
    if changes:
        out.update(t.apply(fs, running.group, changes, journal=Journal(run_dir() / name)))
    if persist:
        out["persisted"] = _persist(str(path), overrides, name)
    return out


def _persist(path: str, overrides: dict[tuple[str, str], object], name: str) -> dict[str, Any]:
    """--persist: into the policy file (comments and layout kept); an installed policy's units
    are rendered from it by `governor install` (said in the result, not done behind the
    operator's back)."""
    from governor import install as inst
    from governor import tune as t
    from governor.errors import PermissionDenied

    try:
        diff_text = t.persist(path, overrides)
    except PermissionError as err:
        raise PermissionDenied(
            "cannot write the policy file", file=path, errno=err.errno, hint="run as its owner"
        ) from err
    installed = inst.manifest_path(Path("/"), name).exists()
    return {"file": path, "diff": diff_text, "installed": installed}


def rollback(name: str, *, to: int | None, everything: bool) -> dict[str, Any]:
    """`governor rollback`: undo the last tune (or back to an entry, or all) from the journal."""
    from governor import tune as t
    from governor.errors import PolicyError
    from governor.journal import Journal
    from governor.kernel.cgroupfs import CgroupFs
    from governor.plan.model import Plan
    from governor.state import run_dir

    st = _governed(name)
    running = Plan.from_dict(st["plan"])
    try:
        return t.rollback(
            CgroupFs(Path(running.cgroup_root)),
            Journal(run_dir() / name),
            to=to,
            everything=everything,
        )
    except ValueError as err:
        raise PolicyError(f"{err} for {name} ({run_dir() / name / 'journal.jsonl'})") from err


def status(name: str | None) -> list[dict[str, Any]]:
    """`governor status`: governor/status.py over the published states."""
    from governor.state import run_dir
    from governor.status import collect

    return collect(run_dir(), name)


def metrics(textfile: Path | None, name: str | None) -> Path | bytes:
    """`governor metrics`: the exposition of the governed slices, written to
    ``textfile/governor.prom`` (atomically) or returned."""
    from governor.metrics.export import exposition, write_textfile
    from governor.state import run_dir

    if textfile is not None:
        return write_textfile(textfile, run_dir(), name)
    return exposition(run_dir(), name)
