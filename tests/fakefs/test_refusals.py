"""A refusal changes nothing: a command that refuses (65/66/69/75/77) leaves the kernel, the
ledgers and the run-dir files as they were, and a rollback takes away only what THIS command
created. A refused re-`apply` (its [clocks] changed while the first apply still holds them)
kills nothing that runs in the slice, removes no group and keeps the ledger's hold.

Needs: a tmp directory (the fake cgroup tree and a copy of the rk3588 clock tree)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.clocks import DMC, board, read, snapshot

from governor.api import apply as api_apply
from governor.api.host import HostOptions
from governor.backends.cgroupfs import CgroupfsBackend
from governor.errors import PolicyError

from .fakekernel import FakeKernelCgroupFs

RK3588 = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "rk3588"


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_refused_reapply_kills_nothing_and_keeps_the_slice_and_the_ledger(
    tmp_path: Path, cgroup_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FakeKernelCgroupFs(cgroup_root)
    monkeypatch.setattr(api_apply, "cgroupfs_backend", lambda plan: CgroupfsBackend(fs))
    run = tmp_path / "run"
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    sysfs = board(tmp_path)
    opts = HostOptions(root=RK3588, cgroup_root=cgroup_root, sysfs_root=sysfs)
    policy = tmp_path / "chat.toml"
    policy.write_text('name = "chat"\n[memory]\nhigh = "300M"\n[clocks]\ndmc = "performance"\n')
    plan = api_apply.apply(policy, opts)
    fs.add_process(plan.leaf, 4242)  # the operator's work in the applied slice
    kernel, clocks, files = _tree(cgroup_root), snapshot(sysfs), _tree(run)

    policy.write_text('name = "chat"\n[memory]\nhigh = "200M"\n[clocks]\ndmc = "powersave"\n')
    with pytest.raises(PolicyError, match="held by policy chat") as err:
        api_apply.apply(policy, opts)
    assert err.value.exit_code == 65
    assert fs.procs(plan.leaf) == [4242]  # not killed
    assert _tree(cgroup_root) == kernel  # memory.high back to 300M, no directory gone
    assert snapshot(sysfs) == clocks and read(sysfs, DMC, "governor") == "performance"
    assert _tree(run) == files  # the ledger's hold and the published state as they were
    holders = json.loads((run / "clocks.json").read_text())["devices"][str(sysfs / DMC)]
    assert [h["policy"] for h in holders["holders"]] == ["chat"]


def test_a_failed_reacquisition_keeps_the_hold_it_had_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from governor.backends.clocks import BoardClocks
    from governor.compile.compiler import compile_plan
    from governor.errors import BackendError
    from governor.kernel import clocks as kc
    from governor.plan.host import probe
    from governor.policy.loader import load_text

    sysfs, run = board(tmp_path), tmp_path / "run"

    def plan_of(clocks: str) -> object:
        policy = load_text(f'name = "chat"\n[clocks]\n{clocks}\n', source="chat.toml")
        return compile_plan(policy, probe(RK3588, sysfs_root=sysfs), source="chat.toml")

    clocks = BoardClocks(run, sysfs_root=sysfs, alive=lambda _pid: True)
    clocks.acquire(plan_of('dmc = "performance"'), pid=None, source="apply")  # type: ignore[arg-type]
    held = (run / "clocks.json").read_text()
    real = kc.write

    def refuse_npu(path: str, value: str) -> None:
        if "npu" in path:
            raise kc._translate(OSError(22, "Invalid argument"), "write", path, value)
        real(path, value)

    monkeypatch.setattr(kc, "write", refuse_npu)
    with pytest.raises(BackendError):  # the same dmc (joined: already held), then the npu fails
        clocks.acquire(
            plan_of('dmc = "performance"\nnpu = "performance"'),  # type: ignore[arg-type]
            pid=None,
            source="apply",
        )
    assert (run / "clocks.json").read_text() == held  # the apply's hold on dmc stays


def test_a_failed_tune_persist_leaves_the_policy_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from governor.api import host as api_host
    from governor.api import tune as api_tune
    from governor.errors import BackendError
    from governor.operate import tune as t
    from governor.rundir.state import Publisher, applied

    cg = tmp_path / "cg"
    shutil.copytree(RK3588 / "sys" / "fs" / "cgroup", cg)
    policy = tmp_path / "st.toml"
    policy.write_text('# mine\nname = "st"\n[memory]\nhigh = "1G"  # keep\n')
    plan = api_host.check(policy, api_host.HostOptions(root=RK3588, cgroup_root=cg))
    group = cg / plan.group
    group.mkdir(parents=True)
    controllers = (cg / "cgroup.controllers").read_text()
    for d in (cg, group.parent, group):  # what apply leaves: every controller enabled down
        (d / "cgroup.subtree_control").write_text(controllers if d != group else "")
    for d in (group.parent, group):
        (d / "cgroup.controllers").write_text(controllers)
    for w in plan.writes:
        (group / w.file).write_text(w.value + "\n")
    (group / "memory.current").write_text("0\n")
    run = tmp_path / "run"
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    state = applied(plan, policy_path=str(policy), created=[], started_at=1.0)
    Publisher(run, "st").publish(state)
    before = policy.read_bytes()

    def fail(*_args: object, **_kw: object) -> None:
        raise BackendError("cannot write cgroup file", cgroup=plan.group, errno=16)

    monkeypatch.setattr(t, "apply", fail)
    with pytest.raises(BackendError):
        api_tune.tune("st", ("memory.high=900M",), dry_run=False, force=True, persist=True)
    assert policy.read_bytes() == before  # the persisted value went back with the failure


def test_a_reapply_keeps_the_record_of_what_the_first_apply_created(
    tmp_path: Path, cgroup_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FakeKernelCgroupFs(cgroup_root)
    monkeypatch.setattr(api_apply, "cgroupfs_backend", lambda plan: CgroupfsBackend(fs))
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(tmp_path / "run"))
    opts = HostOptions(root=RK3588, cgroup_root=cgroup_root)
    policy = tmp_path / "chat.toml"
    policy.write_text('name = "chat"\n[memory]\nhigh = "300M"\n')
    plan = api_apply.apply(policy, opts)
    assert fs.exists(plan.slice)
    api_apply.apply(policy, opts)  # again: it creates nothing this time
    api_apply.remove(policy, opts)
    assert not fs.exists(plan.slice)  # the first apply made it: remove takes it away
