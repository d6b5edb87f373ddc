"""`governor tune --confirm DURATION` on tmp cgroup trees: the journal's pending tunes, confirm,
the revert at the deadline through the rollback path (by the real detached reverter process
too), and tunes through the systemd manager (a fake manager that writes the cgroup file, as
systemd does) that journal their unit so that rollback goes through the manager as well; the
drop-in that --persist writes for an installed policy; `status` saying "tuned, reverts at".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from governor.api import host as api_host
from governor.backends import manager
from governor.deploy import tunedropin
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.operate import tune
from governor.operate.confirm import Reverter, confirm, revert_if_pending
from governor.operate.status import collect, render
from governor.plan.unitmap import Mapping
from governor.policy.durations import parse_seconds as parse_duration
from governor.rundir.journal import Journal
from governor.rundir.state import Publisher

from .plans import make_plan

G = 1 << 30
M = 1 << 20
GROUP = "governor.slice/t"
REPO = Path(__file__).resolve().parents[2]
HOSTS = REPO / "tests" / "fixtures" / "hosts"


def _tree(tmp_path: Path) -> CgroupFs:
    group = tmp_path / "cg" / GROUP
    group.mkdir(parents=True)
    for name, value in {
        kf.MEMORY_CURRENT: str(600 * M),
        kf.MEMORY_MIN: "0",
        kf.MEMORY_HIGH: str(2 * G),
        kf.MEMORY_MAX: str(3 * G),
        kf.MEMORY_RECLAIM: "",
        kf.MEMORY_EVENTS: "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        kf.CPU_WEIGHT: "100",
    }.items():
        (group / name).write_text(value + "\n")
    return CgroupFs(tmp_path / "cg")


def _high(fs: CgroupFs) -> str:
    return fs.read(GROUP, kf.MEMORY_HIGH).strip()


def test_durations_parse_and_a_bad_one_is_refused() -> None:
    assert parse_duration("90s") == 90
    assert parse_duration("5m") == 300
    assert parse_duration("1m30s") == 90
    assert parse_duration("2") == 2
    for bad in ("", "0", "5x", "m", "-1s", "5m3"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_a_confirmed_tune_is_kept_at_the_deadline(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    journal = Journal(tmp_path / "run" / "t")
    entry = tune.apply(
        fs, GROUP, {kf.MEMORY_HIGH: str(G)}, journal=journal, extra={"confirm_by": 1.0}
    )
    assert [e["id"] for e in journal.pending()] == [entry["id"]]
    kept = confirm(journal)
    assert [e["id"] for e in kept] == [entry["id"]]
    assert journal.pending() == [] and journal.entries()[-1]["confirms"] == [entry["id"]]
    assert revert_if_pending(journal, fs, [entry["id"]]) is None
    assert _high(fs) == str(G)
    assert confirm(journal) == []  # nothing waits any more
    # a confirm entry is no change: rollback still undoes the tune itself
    assert tune.rollback(fs, journal)["undoes"] == [entry["id"]]


def test_an_unconfirmed_tune_reverts_through_the_rollback_path(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    journal = Journal(tmp_path / "run" / "t")
    first = tune.apply(fs, GROUP, {kf.CPU_WEIGHT: "300"}, journal=journal)
    entry = tune.apply(
        fs, GROUP, {kf.MEMORY_HIGH: str(G)}, journal=journal, extra={"confirm_by": 1.0}
    )
    undo = revert_if_pending(journal, fs, [entry["id"]])
    assert undo is not None and undo["undoes"] == [entry["id"]]
    assert undo["reason"] == "not confirmed"
    assert _high(fs) == str(2 * G)
    assert fs.read(GROUP, kf.CPU_WEIGHT).strip() == "300"  # only the unconfirmed tune
    assert journal.pending() == [] and journal.tuned(kf.CPU_WEIGHT) == "300"
    assert first["id"] not in journal.undone()
    assert revert_if_pending(journal, fs, [entry["id"]]) is None  # once


def test_a_rolled_back_tune_is_not_pending_and_not_reverted_again(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    journal = Journal(tmp_path / "run" / "t")
    entry = tune.apply(
        fs, GROUP, {kf.MEMORY_HIGH: str(G)}, journal=journal, extra={"confirm_by": 1.0}
    )
    tune.rollback(fs, journal)
    fs.write(GROUP, kf.MEMORY_HIGH, str(G // 2))  # something else since
    assert journal.pending() == []
    assert revert_if_pending(journal, fs, [entry["id"]]) is None
    assert _high(fs) == str(G // 2)


def _spawn(tmp_path: Path, fs: CgroupFs, journal: Journal) -> tuple[Reverter, dict[str, object]]:
    reverter = Reverter(tmp_path / "run", "t", str(tmp_path / "cg"), deadline=0.0)
    entry = tune.apply(
        fs, GROUP, {kf.MEMORY_HIGH: str(G)}, journal=journal,
        extra={"confirm_by": 0.0, "reverter_pid": reverter.pid},
    )  # fmt: skip
    return reverter, entry


def test_the_detached_reverter_process_reverts_after_the_tune_is_gone(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    journal = Journal(tmp_path / "run" / "t")
    reverter, entry = _spawn(tmp_path, fs, journal)
    reverter.go([int(entry["id"])])  # type: ignore[call-overload]  # the entry's id is an int
    assert reverter.proc.wait(timeout=60) == 0
    assert _high(fs) == str(2 * G)
    last = journal.entries()[-1]
    assert (last["source"], last["undoes"], last["reason"]) == (
        "rollback", [entry["id"]], "not confirmed",
    )  # fmt: skip


def test_a_cancelled_reverter_exits_without_touching_anything(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    journal = Journal(tmp_path / "run" / "t")
    reverter, _entry = _spawn(tmp_path, fs, journal)
    reverter.cancel()  # the tune failed after the reverter started
    assert reverter.proc.wait(timeout=60) == 0
    assert _high(fs) == str(G)
    assert journal.entries()[-1]["source"] == "tune"


class FakeManager:
    """Records each runtime property and writes the cgroup file, as systemd does."""

    def __init__(self, fs: CgroupFs, cgroup: str) -> None:
        self.fs, self.cgroup = fs, cgroup
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, unit: str, m: Mapping, value: str) -> None:
        assert m.directive is not None
        self.calls.append((unit, m.directive, m.ini(value)))
        self.fs.write(self.cgroup, m.cgroup_file, value)


def test_tunes_through_the_manager_journal_the_unit_and_roll_back_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = _tree(tmp_path)
    journal = Journal(tmp_path / "run" / "t")
    fake = FakeManager(fs, GROUP)
    monkeypatch.setattr(manager, "set_property", fake)
    unit = "governor-t.slice"
    write = manager.ManagerWriter(fs, unit, GROUP, 252)
    entry = tune.apply(
        fs, GROUP, {kf.MEMORY_MAX: str(G), kf.MEMORY_HIGH: str(900 * M)}, journal=journal,
        write=write, unit={"unit": unit, "systemd": 252},
    )  # fmt: skip
    # staged: MemoryHigh first, memory.reclaim on the cgroup (no property), MemoryMax, MemoryHigh
    assert [c[1] for c in fake.calls] == ["MemoryHigh", "MemoryMax", "MemoryHigh"]
    assert fake.calls[1] == (unit, "MemoryMax", str(G))
    assert all(ch["unit"] == unit for ch in entry["changes"])
    fake.calls.clear()
    tune.rollback(fs, journal)
    assert [c[1] for c in fake.calls] == ["MemoryMax", "MemoryHigh"]  # reverse order
    assert fs.read(GROUP, kf.MEMORY_MAX).strip() == str(3 * G)
    assert _high(fs) == str(2 * G)


def test_the_limits_unit_follows_the_engines_unit() -> None:
    svc = "governor.slice/governor-npu\\x2dchat.slice/governor@npu-chat.service"
    assert manager.limits_unit(svc) == (
        "governor-npu\\x2dchat.slice",
        "governor.slice/governor-npu\\x2dchat.slice",
    )
    scope = "t.slice/governor-x.scope"
    assert manager.limits_unit(scope) == ("governor-x.scope", scope)
    assert manager.managed(kf.MEMORY_HIGH, "1", 252) is not None
    assert manager.managed(kf.MEMORY_MIN, "1", 239) is None  # MemoryMin= needs 240
    assert manager.managed(kf.MEMORY_OOM_GROUP, "1", 252) is None


def test_systemctl_show_values_in_the_kernels_spelling() -> None:
    props = {
        "MemoryHigh": "209715200",
        "MemoryMax": "infinity",
        "TasksMax": "64",
        "CPUWeight": "[not set]",
        "IOWeight": "60",
        "AllowedCPUs": "1",
        "CPUQuotaPerSecUSec": "1.500000s",
        "CPUQuotaPeriodUSec": "infinity",
    }
    assert manager.kernel_spelling(props) == {
        kf.MEMORY_HIGH: "209715200",
        kf.MEMORY_MAX: "max",
        kf.PIDS_MAX: "64",
        kf.CPU_WEIGHT: None,
        kf.IO_WEIGHT: "default 60",
        kf.CPUSET_CPUS: "1",
        kf.CPU_MAX: "150000 100000",
    }
    half = manager.kernel_spelling({"CPUQuotaPerSecUSec": "500ms", "CPUQuotaPeriodUSec": "50ms"})
    assert half[kf.CPU_MAX] == "25000 50000"
    assert manager.same(kf.MEMORY_HIGH, "209715200", "209715201")  # page rounding
    assert not manager.same(kf.MEMORY_HIGH, "209715200", "309715200")


def test_the_persisted_drop_in_merges_and_rollback_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reloads: list[str] = []
    monkeypatch.setattr("governor.deploy.tunedropin.daemon_reload", lambda: reloads.append("r"))
    path = tmp_path / "etc" / "governor-t.slice.d" / tunedropin.DROPIN_NAME
    first = tunedropin.persist_dropin(str(path), "Slice", {"MemoryHigh": "300M"})
    assert first["before"] is None and "+MemoryHigh=300M" in first["diff"]
    second = tunedropin.persist_dropin(
        str(path), "Slice", {"CPUWeight": "300", "MemoryHigh": "250M"}
    )
    text = path.read_text()
    assert "[Slice]\nMemoryHigh=250M\nCPUWeight=300\n" in text
    assert "-MemoryHigh=300M" in second["diff"] and "+MemoryHigh=250M" in second["diff"]
    assert tunedropin.persist_dropin(str(path), "Slice", {"MemoryHigh": "250M"})["diff"] == ""
    tunedropin.restore_dropin({"path": str(path), "before": second["before"]})
    assert "MemoryHigh=300M" in path.read_text() and "CPUWeight" not in path.read_text()
    tunedropin.restore_dropin({"path": str(path), "before": None})
    assert not path.exists() and not path.parent.exists()
    assert reloads == ["r", "r"]


def test_status_says_tuned_and_when_it_reverts_unless_confirmed(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    shutil.copytree(HOSTS / "rk3588" / "sys" / "fs" / "cgroup", cg)
    policy = tmp_path / "st.toml"
    policy.write_text('name = "st"\n[memory]\nhigh = "1G"\nmax = "1536M"\n')
    plan = api_host.check(policy, api_host.HostOptions(root=HOSTS / "rk3588", cgroup_root=cg))
    group = cg / plan.group
    group.mkdir(parents=True)
    for w in plan.writes:
        (group / w.file).write_text(w.value + "\n")
    (group / kf.MEMORY_EVENTS).write_text("oom_kill 0\n")
    run = tmp_path / "run"
    Publisher(run, "st").publish(
        {"policy": "st", "source": "apply", "pid": None, "plan": plan.to_dict()}
    )
    fs = CgroupFs(cg)
    journal = Journal(run / "st")
    # what status recognises as the reverter: a process whose command line names it
    reverter = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "governor.operate.confirm"]
    )
    try:
        # its command line shows once the exec has finished (Popen returns a little earlier)
        for _ in range(500):
            if b"governor.operate.confirm" in Path(f"/proc/{reverter.pid}/cmdline").read_bytes():
                break
            time.sleep(0.01)
        entry = tune.apply(
            fs, plan.group, {kf.MEMORY_HIGH: str(900 * M)}, journal=journal,
            extra={"confirm_by": 2_000_000_000.0, "reverter_pid": reverter.pid},
        )  # fmt: skip
        (item,) = collect(run, "st")
    finally:
        reverter.kill()
        reverter.wait()
    knobs = {k["file"]: k for k in item["knobs"]}
    assert knobs[kf.MEMORY_HIGH]["state"] == "tuned"
    assert knobs[kf.MEMORY_HIGH]["reverts_at"] == 2_000_000_000.0
    assert knobs[kf.MEMORY_MAX]["state"] == "in sync" and knobs[kf.MEMORY_MAX]["unit"] is None
    assert item["pending_confirm"] == [
        {
            "id": entry["id"],
            "confirm_by": 2_000_000_000.0,
            "files": [kf.MEMORY_HIGH],
            "reverter_pid": reverter.pid,
            "reverter_alive": True,
        }
    ]
    text = render([item])
    assert "tuned, reverts at" in text and "unless confirmed" in text
    # the reverter killed (a logout with KillUserProcesses=yes): status no longer promises
    (item,) = collect(run, "st")
    knob = next(k for k in item["knobs"] if k["file"] == kf.MEMORY_HIGH)
    assert (knob["state"], knob["reverts_at"]) == ("tuned", None)
    assert item["pending_confirm"][0]["reverter_alive"] is False
    text = render([item])
    assert "will NOT revert" in text and f"(pid {reverter.pid}) is gone" in text, text
    assert "reverts at" not in text
    confirm(journal)
    (item,) = collect(run, "st")
    knob = next(k for k in item["knobs"] if k["file"] == kf.MEMORY_HIGH)
    assert (knob["state"], knob["reverts_at"], item["pending_confirm"]) == ("tuned", None, [])


def test_uninstall_removes_the_persisted_tune_drop_in(tmp_path: Path) -> None:
    from governor.deploy import install as inst
    from governor.deploy.dropin import UnitFile

    files = [UnitFile("etc/systemd/system/governor-t.slice", "[Slice]\nMemoryHigh=1\n")]
    inst.install("t", files, ["governor-t.slice", "governor@t.service"], root=tmp_path)
    conf = tmp_path / "etc/systemd/system/governor-t.slice.d" / tunedropin.DROPIN_NAME
    tunedropin.persist_dropin(str(conf), "Slice", {"MemoryHigh": "2"})
    res = inst.uninstall("t", root=tmp_path)
    assert not conf.exists() and not conf.parent.exists()
    assert any(c.path.endswith(tunedropin.DROPIN_NAME) and c.new is None for c in res.changes)
    assert not (tmp_path / "etc/systemd/system/governor-t.slice").exists()


def test_status_knobs_under_systemd_carry_the_units_value_and_its_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from governor.operate import observe

    fs = _tree(tmp_path)
    unit_says = {kf.MEMORY_HIGH: str(2 * G), kf.MEMORY_MAX: str(3 * G), kf.CPU_WEIGHT: "100"}
    monkeypatch.setattr(manager, "unit_values", lambda unit: dict(unit_says))
    systemd = {
        "unit": "governor-t.slice",
        "cgroup": GROUP,
        "version": 252,
        "limits": [
            {"file": kf.MEMORY_HIGH, "reason": "memory.high", "policy": str(2 * G)},
            {"file": kf.MEMORY_MAX, "reason": "memory.max", "policy": str(3 * G)},
            {"file": kf.CPU_WEIGHT, "reason": "cpu.weight", "policy": "100"},
        ],
    }
    plan = make_plan(writes=(), group=f"{GROUP}/engine")
    journal = Journal(tmp_path / "run" / "t")
    # tuned through the manager: kernel and unit agree, both differ from the policy
    tune.apply(fs, GROUP, {kf.MEMORY_HIGH: str(G)}, journal=journal)
    unit_says[kf.MEMORY_HIGH] = str(G)
    # written behind the manager's back: the kernel differs from the unit
    fs.write(GROUP, kf.CPU_WEIGHT, "50")
    rows = {k["file"]: k for k in observe.knobs(fs, plan, journal=journal, systemd=systemd)}
    assert (rows[kf.MEMORY_HIGH]["unit"], rows[kf.MEMORY_HIGH]["state"]) == (str(G), "tuned")
    assert rows[kf.MEMORY_MAX]["state"] == "in sync"
    assert (rows[kf.CPU_WEIGHT]["kernel"], rows[kf.CPU_WEIGHT]["unit"]) == ("50", "100")
    assert rows[kf.CPU_WEIGHT]["state"] == "unit drifted"
