"""governor tune / rollback on tmp cgroup trees: the guards, the staged lowering of memory.max,
the revert on an OOM kill, the journal, and the monitor keeping the operator's values."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.backends.cgroupfs import CgroupfsBackend
from governor.compile.compiler import compile_action
from governor.errors import BackendError, PolicyError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.monitor.actions.base import Context, Env
from governor.monitor.actions.executor import Executor
from governor.operate.tune import (
    apply,
    check_guards,
    margin,
    parse_assignments,
    persist,
    rollback,
    steps,
)
from governor.policy.values import parse_action
from governor.rundir.journal import Journal

from .fakekernel import FakeKernelCgroupFs
from .plans import GROUP as PLAN_GROUP
from .plans import MEMORY_MAX as PLAN_MAX
from .plans import make_plan

G = 1 << 30
M = 1 << 20
GROUP = "governor.slice/t"
TUNED = 3 * G // 2


def _tree(tmp_path: Path, **files: str) -> CgroupFs:
    group = tmp_path / "cg" / GROUP
    group.mkdir(parents=True)
    defaults = {
        kf.MEMORY_CURRENT: str(600 * M),
        kf.MEMORY_MIN: "0",
        kf.MEMORY_HIGH: str(2 * G),
        kf.MEMORY_MAX: str(3 * G),
        kf.MEMORY_RECLAIM: "",
        kf.MEMORY_EVENTS: "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        kf.CPU_WEIGHT: "100",
    }
    for name, value in {**defaults, **{k.replace("_", "."): v for k, v in files.items()}}.items():
        (group / name).write_text(value + "\n")
    return CgroupFs(tmp_path / "cg")


def test_assignments_use_the_policy_spelling_and_a_bad_key_is_65() -> None:
    assert parse_assignments(["memory.high=1.5GiB", "cpu.weight=200", "pids.max=max"]) == {
        ("memory", "high"): "1.5GiB",
        ("cpu", "weight"): 200,
        ("pids", "max"): "max",
    }
    with pytest.raises(PolicyError) as info:
        parse_assignments(["memory.oom_kill_disable=1"])
    assert info.value.exit_code == 65 and "memory.oom_kill_disable" in str(info.value)
    with pytest.raises(PolicyError, match="expected KEY=VALUE"):
        parse_assignments(["memory.high"])


def test_lowering_max_below_usage_plus_margin_is_refused_with_the_numbers(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    current = 600 * M
    too_low = str(current + margin(current) - 4096)
    with pytest.raises(PolicyError) as info:
        check_guards(fs, GROUP, {kf.MEMORY_MAX: too_low}, force=False)
    assert info.value.exit_code == 65
    assert f"memory.current {current}" in str(info.value)
    check_guards(fs, GROUP, {kf.MEMORY_MAX: too_low}, force=True)  # --force overrides
    fs.write(GROUP, kf.MEMORY_MIN, str(2 * G))
    with pytest.raises(PolicyError, match=r"below memory\.min"):
        check_guards(fs, GROUP, {kf.MEMORY_MAX: str(G)}, force=False)


def test_lowering_max_goes_high_then_reclaim_then_max_then_the_tuned_high() -> None:
    before = {kf.MEMORY_HIGH: str(2 * G), kf.MEMORY_MAX: str(3 * G)}
    current = 1200 * M
    plan = steps(before, {kf.MEMORY_MAX: str(G), kf.MEMORY_HIGH: str(900 * M)}, current)
    assert [f for f, _ in plan] == [
        kf.MEMORY_HIGH,
        kf.MEMORY_RECLAIM,
        kf.MEMORY_MAX,
        kf.MEMORY_HIGH,
    ]
    assert plan[0][1] == str(900 * M)
    assert plan[1][1] == str(current - G + margin(current))
    # raising: no staging, max before high
    up = steps(before, {kf.MEMORY_MAX: str(4 * G), kf.MEMORY_HIGH: str(3 * G)}, current)
    assert up == [(kf.MEMORY_MAX, str(4 * G)), (kf.MEMORY_HIGH, str(3 * G))]


def test_lowering_max_without_memory_reclaim_still_applies(tmp_path: Path) -> None:
    """Linux < 5.19 (a board's 5.10): no memory.reclaim; the staged memory.high does the
    reclaim within its own write, and the tune is applied, not failed."""
    fs = _tree(tmp_path, memory_current=str(1200 * M))  # above the new max: a reclaim step
    (fs.path(GROUP) / kf.MEMORY_RECLAIM).unlink()
    assert kf.MEMORY_RECLAIM in dict(steps({kf.MEMORY_MAX: str(3 * G)}, {kf.MEMORY_MAX: str(G)},
                                           1200 * M))  # fmt: skip
    apply(fs, GROUP, {kf.MEMORY_MAX: str(G)}, journal=Journal(tmp_path / "run" / "t"))
    assert fs.read(GROUP, kf.MEMORY_MAX).strip() == str(G)
    assert fs.read(GROUP, kf.MEMORY_HIGH).strip() == str(G)


def test_apply_journals_and_rollback_restores_the_last_tune(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    journal = Journal(tmp_path / "run" / "t")
    first = apply(fs, GROUP, {kf.MEMORY_HIGH: str(G)}, journal=journal)
    second = apply(fs, GROUP, {kf.CPU_WEIGHT: "300"}, journal=journal)
    assert (first["id"], second["id"]) == (1, 2)
    assert first["changes"] == [
        {"cgroup": GROUP, "file": kf.MEMORY_HIGH, "before": str(2 * G), "after": str(G)}
    ]
    assert journal.tuned(kf.MEMORY_HIGH) == str(G)
    undo = rollback(fs, journal)
    assert undo["undoes"] == [2] and fs.read(GROUP, kf.CPU_WEIGHT).strip() == "100"
    assert fs.read(GROUP, kf.MEMORY_HIGH).strip() == str(G)  # only the last tune
    everything = rollback(fs, journal, everything=True)
    assert everything["undoes"] == [1]
    assert fs.read(GROUP, kf.MEMORY_HIGH).strip() == str(2 * G)
    with pytest.raises(ValueError, match="nothing to roll back"):
        rollback(fs, journal)


def test_an_oom_kill_during_the_change_reverts_every_write(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    journal = Journal(tmp_path / "run" / "t")
    kills = iter([0, 1])
    with pytest.raises(BackendError, match="reverted"):
        apply(
            fs,
            GROUP,
            {kf.MEMORY_MAX: str(G), kf.MEMORY_HIGH: str(900 * M)},
            journal=journal,
            read_oom_kills=lambda: next(kills),
        )
    assert fs.read(GROUP, kf.MEMORY_MAX).strip() == str(3 * G)
    assert fs.read(GROUP, kf.MEMORY_HIGH).strip() == str(2 * G)
    assert journal.entries() == []


def test_the_monitor_keeps_a_tuned_value_and_its_bounds_follow_the_tune(
    fake_fs: FakeKernelCgroupFs, tmp_path: Path
) -> None:
    CgroupfsBackend(fake_fs).apply(make_plan())
    plan = make_plan()
    journal = Journal(tmp_path / "run")
    journal.append(
        "tune",
        [
            {
                "cgroup": PLAN_GROUP,
                "file": kf.MEMORY_MAX,
                "before": str(PLAN_MAX),
                "after": str(TUNED),
            }
        ],
    )
    journal.append(
        "tune",
        [{"cgroup": PLAN_GROUP, "file": kf.CPU_WEIGHT, "before": "200", "after": "50"}],
    )
    ex = Executor(Env(fake_fs, plan, engine_pids=lambda: [4242], journal=journal))
    ctx = Context(rule=0, when="memory some 150ms/2s")
    fake_fs.write(PLAN_GROUP, kf.CPU_WEIGHT, "50")
    kept = ex.execute(compile_action(parse_action("set cpu.weight 400")), ctx)
    assert kept.ok and "tuned" in (kept.detail or "")
    assert fake_fs.read(PLAN_GROUP, kf.CPU_WEIGHT).strip() == "50"
    # the bound follows the tuned memory.max (1.5 GiB), not the plan's 1.8 GiB
    fake_fs.write(PLAN_GROUP, kf.MEMORY_HIGH, "max")
    res = ex.execute(compile_action(parse_action("set memory.high -10%")), ctx)
    assert res.ok
    assert int(fake_fs.read(PLAN_GROUP, kf.MEMORY_HIGH)) == TUNED * 9 // 10 // 4096 * 4096
    assert journal.entries()[-1]["source"] == "monitor"


def test_persist_writes_the_policy_file_keeping_comments_and_layout(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text(
        '# chat on the board\nname = "p"\n\n[memory]\nhigh = "1.6GiB"  # throttle here\n'
        'max = "1.8GiB"\n'
    )
    policy.chmod(0o640)
    diff = persist(str(policy), {("memory", "high"): "1.4GiB", ("cpu", "weight"): 300})
    text = policy.read_text()
    assert "# chat on the board" in text and "# throttle here" in text
    assert 'high = "1.4GiB"' in text and "[cpu]\nweight = 300" in text
    assert '-high = "1.6GiB"' in diff and '+high = "1.4GiB"' in diff
    assert policy.stat().st_mode & 0o777 == 0o640
    assert persist(str(policy), {("memory", "high"): "1.4GiB"}) == ""  # already says so


def test_rollback_to_an_entry_undoes_every_tune_after_it_and_keeps_the_entry(
    tmp_path: Path,
) -> None:
    """`rollback --to ID` (the guest's staged-tune test proved it on a real kernel until issue
    47 item 3 cut that part): the entries after ID in reverse, ID itself kept."""
    fs = _tree(tmp_path)
    journal = Journal(tmp_path / "run" / "t")
    staged = apply(fs, GROUP, {kf.MEMORY_HIGH: str(G)}, journal=journal)
    apply(fs, GROUP, {kf.CPU_WEIGHT: "300"}, journal=journal)
    apply(fs, GROUP, {kf.CPU_WEIGHT: "500"}, journal=journal)
    undo = rollback(fs, journal, to=staged["id"])
    assert undo["undoes"] == [2, 3]
    assert fs.read(GROUP, kf.CPU_WEIGHT).strip() == "100"  # 3 then 2: reverse order
    assert fs.read(GROUP, kf.MEMORY_HIGH).strip() == str(G)  # the entry ID itself stays
    with pytest.raises(ValueError, match="nothing to roll back"):
        rollback(fs, journal, to=staged["id"])
