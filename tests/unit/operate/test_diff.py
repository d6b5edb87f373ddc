"""`governor diff` (governor/operate/diff.py, api_diff.diff): compiled plan vs kernel files vs installed units,
over fixture hosts and tmp cgroup/unit trees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from governor.api import diff as api_diff
from governor.api import host as api_host
from governor.deploy import dropin, tunedropin
from governor.deploy.install import manifest_path
from governor.operate.diff import render, skipped_name
from governor.plan import unitmap
from governor.record import replace
from governor.rundir.state import Publisher

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
    out = api_diff.diff(policy, opts, install_root=tmp_path / "root")
    assert out["in_sync"], render(out)
    assert not out["systemd_checked"]
    group = Path(str(opts.cgroup_root)) / "governor.slice" / "df"
    (group / "memory.high").write_text("536870912\n")
    out = api_diff.diff(policy, opts, install_root=tmp_path / "root")
    assert not out["in_sync"]
    (k,) = out["kernel"]
    assert (k["file"], k["plan"], k["kernel"]) == ("memory.high", str(1 << 30), "536870912")
    assert "plan 1073741824, kernel 536870912" in render(out)


def test_a_group_that_does_not_exist_is_drift(tmp_path: Path) -> None:
    policy, opts = _setup(tmp_path)
    shutil.rmtree(Path(str(opts.cgroup_root)) / "governor.slice" / "df")
    out = api_diff.diff(policy, opts, install_root=tmp_path / "root")
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
    out = api_diff.diff(policy, opts, install_root=root)
    assert out["systemd_checked"] and out["in_sync"], render(out)
    unit = root / "etc/systemd/system" / unitmap.policy_slice(plan.slice, plan.policy)
    unit.write_text(unit.read_text().replace("MemoryMax=", "MemoryMax=1 #"))
    out = api_diff.diff(policy, opts, install_root=root)
    assert [u["file"] for u in out["systemd"]] == [str(unit.relative_to(root))]
    # put back; then a `tune --persist` drop-in on the slice: the policy no longer rules
    unit.write_text(unit.read_text().replace("MemoryMax=1 #", "MemoryMax="))
    assert api_diff.diff(policy, opts, install_root=root)["in_sync"]
    tuned = Path(f"{unit}.d") / tunedropin.DROPIN_NAME
    tuned.parent.mkdir()
    tuned.write_text("[Slice]\nMemoryHigh=300M\n")
    out = api_diff.diff(policy, opts, install_root=root)
    assert not out["in_sync"]
    (u,) = out["systemd"]
    assert u["file"] == str(tuned.relative_to(root)) and "MemoryHigh=300M" in u["installed"]
    assert "a persisted tune overrides the policy" in render(out)


def _without_memory(tmp_path: Path) -> tuple[Path, api_host.HostOptions, Path]:
    """The df slice on a board whose cgroup2 has no memory controller (this machine's case):
    (policy file, options without --allow-missing, the run dir)."""
    cg = tmp_path / "cg"
    shutil.copytree(HOSTS / "rk3588" / "sys" / "fs" / "cgroup", cg)
    for name in ("cgroup.controllers", "cgroup.subtree_control"):
        words = (cg / name).read_text().split()
        (cg / name).write_text(" ".join(w for w in words if w != "memory") + "\n")
    policy = tmp_path / "df.toml"
    policy.write_text(POLICY)
    opts = api_host.HostOptions(root=HOSTS / "rk3588", cgroup_root=cg)
    plan = api_host.check(policy, replace(opts, allow_missing=frozenset({"memory"})))
    assert [skipped_name(x) for x in plan.degraded] == ["memory", "memory"]
    group = cg / plan.group
    group.mkdir(parents=True)
    for level in (group.parent, group):
        for name in ("cgroup.controllers", "cgroup.subtree_control"):
            shutil.copy(cg / name, level / name)
    for w in plan.writes:
        (group / w.file).write_text(w.value + "\n")
    run = tmp_path / "run"
    return policy, opts, run


def _drift_metric(run: Path) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    from governor.metrics.export import exposition

    for fam in text_string_to_metric_families(exposition(run, "df").decode()):
        for s in fam.samples:
            if s.name == "governor_policy_drift":
                return s.value
    raise AssertionError("no governor_policy_drift")


def test_limits_diff_is_told_to_skip_are_skipped_not_drift(tmp_path: Path) -> None:
    policy, opts, _ = _without_memory(tmp_path)
    out = api_diff.diff(policy, opts, install_root=tmp_path / "root")
    assert not out["in_sync"] and out["skipped"] == []
    assert [p["want"].split(" = ")[0] for p in out["prerequisites"]] == [
        "memory.high",
        "memory.max",
    ]
    allowed = replace(opts, allow_missing=frozenset({"memory"}))
    out = api_diff.diff(policy, allowed, install_root=tmp_path / "root")
    assert out["in_sync"] and out["prerequisites"] == [], render(out)
    assert [s["by"] for s in out["skipped"]] == ["--allow-missing", "--allow-missing"]
    text = render(out)
    assert text.startswith("df: in sync")
    assert "  skipped limit: memory.max = 1610612736 (memory controller missing)" in text


def test_diff_and_the_drift_metric_give_one_answer_for_what_launch_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy runs with --allow-missing memory (its published plan says so): diff without
    the flag reads that and agrees with governor_policy_drift, in sync and after a drift."""
    policy, opts, run = _without_memory(tmp_path)
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    plan = api_host.check(policy, replace(opts, allow_missing=frozenset({"memory"})))
    Publisher(run, "df").publish(
        {"policy": "df", "source": "apply", "pid": None, "plan": plan.to_dict()}
    )
    out = api_diff.diff(policy, opts, install_root=tmp_path / "root")
    assert (out["in_sync"], _drift_metric(run)) == (True, 0), render(out)
    assert {s["by"] for s in out["skipped"]} == {"the --allow-missing it runs with"}
    group = Path(str(opts.cgroup_root)) / plan.group
    (group / "pids.max").write_text("7\n")
    out = api_diff.diff(policy, opts, install_root=tmp_path / "root")
    assert (out["in_sync"], _drift_metric(run)) == (False, 1), render(out)
    assert [k["file"] for k in out["kernel"]] == ["pids.max"]
