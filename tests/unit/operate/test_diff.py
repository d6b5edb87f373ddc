"""`governor diff` (governor/operate/diff.py, api_operate.diff): compiled plan vs kernel files vs installed units,
over fixture hosts and tmp cgroup/unit trees."""

from __future__ import annotations

import shutil
from pathlib import Path

from governor.api import host as api_host
from governor.api import operate as api_operate
from governor.deploy import dropin, tunedropin
from governor.deploy.install import manifest_path
from governor.operate.diff import render
from governor.plan import unitmap

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
POLICY = 'name = "df"\n[memory]\nhigh = "1G"\nmax = "1536M"\n[pids]\nmax = 64\n'


def _setup(tmp_path: Path) -> tuple[Path, api_host.HostOptions]:
    cg = tmp_path / "cg"
    shutil.copytree(HOSTS / "rk3588" / "sys" / "fs" / "cgroup", cg)
    policy = tmp_path / "df.toml"
    policy.write_text(POLICY)
    opts = api_host.HostOptions(root=HOSTS / "rk3588", cgroup_root=cg)
    plan = api_host.check(policy, opts)
    group = cg / plan.group
    group.mkdir(parents=True)
    for level in (group.parent, group):  # probe() reads each existing level's controllers
        for name in ("cgroup.controllers", "cgroup.subtree_control"):
            shutil.copy(cg / name, level / name)
    for w in plan.writes:
        (group / w.file).write_text(w.value + "\n")
    return policy, opts


def test_in_sync_then_a_kernel_write_is_drift_with_both_values(tmp_path: Path) -> None:
    policy, opts = _setup(tmp_path)
    out = api_operate.diff(policy, opts, install_root=tmp_path / "root")
    assert out["in_sync"], render(out)
    assert not out["systemd_checked"]
    group = Path(str(opts.cgroup_root)) / "governor.slice" / "df"
    (group / "memory.high").write_text("536870912\n")
    out = api_operate.diff(policy, opts, install_root=tmp_path / "root")
    assert not out["in_sync"]
    (k,) = out["kernel"]
    assert (k["file"], k["plan"], k["kernel"]) == ("memory.high", str(1 << 30), "536870912")
    assert "plan 1073741824, kernel 536870912" in render(out)


def test_a_group_that_does_not_exist_is_drift(tmp_path: Path) -> None:
    policy, opts = _setup(tmp_path)
    shutil.rmtree(Path(str(opts.cgroup_root)) / "governor.slice" / "df")
    out = api_operate.diff(policy, opts, install_root=tmp_path / "root")
    assert not out["in_sync"] and out["kernel"][0]["kernel"] == "does not exist"


def test_installed_units_are_compared_with_what_install_renders_now(tmp_path: Path) -> None:
    policy, opts = _setup(tmp_path)
    root = tmp_path / "root"
    plan = api_host.check(policy, opts)
    host = api_host.probe_host(opts)
    assert host.systemd_version is not None
    for f in dropin.render_install(plan, host.systemd_version, policy_path=str(policy.resolve())):
        (root / f.path).parent.mkdir(parents=True, exist_ok=True)
        (root / f.path).write_text(f.text)
    manifest_path(root, "df").parent.mkdir(parents=True, exist_ok=True)
    manifest_path(root, "df").write_text("{}")
    out = api_operate.diff(policy, opts, install_root=root)
    assert out["systemd_checked"] and out["in_sync"], render(out)
    unit = root / "etc/systemd/system" / unitmap.policy_slice(plan.slice, plan.policy)
    unit.write_text(unit.read_text().replace("MemoryMax=", "MemoryMax=1 #"))
    out = api_operate.diff(policy, opts, install_root=root)
    assert [u["file"] for u in out["systemd"]] == [str(unit.relative_to(root))]
    # put back; then a `tune --persist` drop-in on the slice: the policy no longer rules
    unit.write_text(unit.read_text().replace("MemoryMax=1 #", "MemoryMax="))
    assert api_operate.diff(policy, opts, install_root=root)["in_sync"]
    tuned = Path(f"{unit}.d") / tunedropin.DROPIN_NAME
    tuned.parent.mkdir()
    tuned.write_text("[Slice]\nMemoryHigh=300M\n")
    out = api_operate.diff(policy, opts, install_root=root)
    assert not out["in_sync"]
    (u,) = out["systemd"]
    assert u["file"] == str(tuned.relative_to(root)) and "MemoryHigh=300M" in u["installed"]
    assert "a persisted tune overrides the policy" in render(out)
