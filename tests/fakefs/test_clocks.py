"""[clocks] at run time on a copy of the rk3588 fixture's clock tree (governor/backends/
clocks.py): set and verified, restored exactly; a write the kernel does not keep is an error
with everything restored; two policies asking for different clocks of one device are refused,
identical ones share it until the last lets go; a dead holder's device is restored by the next
acquisition, and by the watchdog when the governor dies; status and diff show the clocks.

Needs: a tmp directory, /bin/sh (the watchdog) and flock."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers.clocks import DMC, POLICY0, POLICY4, POLICY6, board, read, snapshot

from governor.backends.clocks import ANY_PID, BoardClocks
from governor.compile.compiler import compile_plan
from governor.errors import BackendError, PolicyError
from governor.kernel import clocks as kc
from governor.operate import clocks as oc
from governor.operate import diff as d
from governor.plan.host import probe
from governor.plan.model import Plan
from governor.policy.loader import load_text
from governor.rundir.clocks import Ledger
from governor.supervise.watchdog import fork_watchdog

RK3588 = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "rk3588"


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return board(tmp_path)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return tmp_path / "run"


def plan_of(sysfs: Path, clocks: str, name: str = "chat") -> Plan:
    policy = load_text(f'name = "{name}"\n[clocks]\n{clocks}\n', source=f"{name}.toml")
    return compile_plan(policy, probe(RK3588, sysfs_root=sysfs), source=f"{name}.toml")


def ledger(run: Path) -> dict[str, dict[str, Any]]:
    path = run / "clocks.json"
    return json.loads(path.read_text())["devices"] if path.exists() else {}


def _all_alive(_pid: int) -> bool:
    return True


def test_acquire_sets_and_reads_back_release_restores_exactly(sysfs: Path, run: Path) -> None:
    before = snapshot(sysfs)
    plan = plan_of(sysfs, 'big = { governor = "userspace", min = "max" }\ndmc = "performance"')
    clocks = BoardClocks(run, sysfs_root=sysfs, alive=_all_alive)
    written = clocks.acquire(plan, pid=os.getpid(), source="launch")
    assert len(written) == 3  # policy4, policy6, dmc
    for policy in (POLICY4, POLICY6):
        assert read(sysfs, policy, "scaling_governor") == "userspace"
        assert read(sysfs, policy, "scaling_min_freq") == "2352000"
    assert read(sysfs, POLICY0, "scaling_governor") == "schedutil"  # LITTLE untouched
    assert read(sysfs, DMC, "governor") == "performance"
    saved = ledger(run)[str(sysfs / POLICY4)]["saved"]
    assert saved == [["scaling_governor", "schedutil"], ["scaling_min_freq", "408000"]]

    assert clocks.release("chat", pid=os.getpid()) == ["policy4", "policy6", "dmc"]
    after = snapshot(sysfs)
    assert after == before
    assert ledger(run) == {}


def _kernel_like(monkeypatch: pytest.MonkeyPatch, cap: dict[str, int] | None = None) -> None:
    """kc.write as cpufreq/devfreq take it: a min above the current max (or the reverse) is
    EINVAL; a file in ``cap`` keeps at most that value (a thermal cap) whatever is written."""
    real = kc.write

    def write(path: str, value: str) -> None:
        name = os.path.basename(path)
        pair = {"scaling_min_freq": "scaling_max_freq", "min_freq": "max_freq"}
        pair |= {v: k for k, v in pair.items()}
        if name in pair and value.isdigit():
            other = int(Path(path).with_name(pair[name]).read_text())
            if ("min" in name and int(value) > other) or ("max" in name and int(value) < other):
                raise kc._translate(OSError(errno.EINVAL, "Invalid argument"), "write", path, value)
        limit = (cap or {}).get(path)
        real(path, str(min(int(value), limit)) if limit is not None else value)

    monkeypatch.setattr(kc, "write", write)


def test_min_and_max_go_in_the_order_the_kernel_accepts(
    sysfs: Path, run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kernel_like(monkeypatch)
    clocks = BoardClocks(run, sysfs_root=sysfs, alive=_all_alive)
    (sysfs / POLICY0 / "scaling_max_freq").write_text("1416000\n")  # a user's cap
    up = plan_of(sysfs, 'little = { min = "max", max = "max" }')  # max first, then min
    clocks.acquire(up, pid=1, source="launch")
    assert read(sysfs, POLICY0, "scaling_min_freq") == "1800000"
    clocks.release("chat", pid=1)
    assert read(sysfs, POLICY0, "scaling_max_freq") == "1416000"
    (sysfs / POLICY0 / "scaling_max_freq").write_text("1800000\n")
    (sysfs / POLICY0 / "scaling_min_freq").write_text("1416000\n")
    down = plan_of(sysfs, 'little = { min = "min", max = 816000 }')  # min first, then max
    clocks.acquire(down, pid=1, source="launch")
    assert read(sysfs, POLICY0, "scaling_max_freq") == "816000"
    clocks.release("chat", pid=1)  # back in reverse: every step valid again
    assert read(sysfs, POLICY0, "scaling_min_freq") == "1416000"
    assert read(sysfs, POLICY0, "scaling_max_freq") == "1800000"


def test_a_write_that_does_not_stick_fails_and_restores_what_was_written(
    sysfs: Path, run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot(sysfs)
    capped = str(sysfs / POLICY6 / "scaling_min_freq")
    _kernel_like(monkeypatch, cap={capped: 1800000})
    plan = plan_of(sysfs, 'dmc = "performance"\nbig = { governor = "performance", min = "max" }')
    with pytest.raises(BackendError, match="did not stick") as err:
        BoardClocks(run, sysfs_root=sysfs, alive=_all_alive).acquire(plan, pid=1, source="launch")
    assert err.value.exit_code == 71
    assert "reads back '1800000'" in str(err.value) and err.value.file == capped
    # policy4 and dmc were set and verified before policy6 failed: all of it came back
    assert snapshot(sysfs) == before
    assert ledger(run) == {}


def test_a_second_policy_asking_other_clocks_is_refused_naming_the_holder(
    sysfs: Path, run: Path
) -> None:
    clocks = BoardClocks(run, sysfs_root=sysfs, alive=_all_alive)
    clocks.acquire(plan_of(sysfs, 'dmc = "performance"', "chat"), pid=4242, source="launch")
    state = snapshot(sysfs)
    other = plan_of(sysfs, 'big = "performance"\ndmc = "powersave"', "batch")
    with pytest.raises(PolicyError) as err:
        clocks.acquire(other, pid=4343, source="launch")
    message = str(err.value)
    assert err.value.exit_code == 65 and err.value.field == "clocks.dmc"
    assert "held by policy chat (pid 4242) with governor=performance" in message
    assert "asks for governor=powersave" in message
    assert snapshot(sysfs) == state  # nothing of batch's was written (not even big)
    assert [h["policy"] for h in ledger(run)[str(sysfs / DMC)]["holders"]] == ["chat"]


def test_identical_requests_share_and_the_last_holder_restores(sysfs: Path, run: Path) -> None:
    clocks = BoardClocks(run, sysfs_root=sysfs, alive=_all_alive)
    chat = plan_of(sysfs, 'dmc = "performance"', "chat")
    batch = plan_of(sysfs, 'dmc = "performance"', "batch")
    assert clocks.acquire(chat, pid=None, source="apply") == [str(sysfs / DMC)]
    assert clocks.acquire(batch, pid=77, source="launch") == []  # joined, nothing written
    assert clocks.release("chat", pid=ANY_PID) == []  # batch still holds it
    assert read(sysfs, DMC, "governor") == "performance"
    assert clocks.release("batch", pid=77) == ["dmc"]
    assert read(sysfs, DMC, "governor") == "dmc_ondemand"


def test_a_dead_holders_device_is_restored_by_the_next_acquisition(sysfs: Path, run: Path) -> None:
    dead = BoardClocks(run, sysfs_root=sysfs, alive=lambda pid: pid != 999)
    dead.acquire(plan_of(sysfs, 'dmc = "performance"', "chat"), pid=999, source="launch")
    # chat's governor died with its watchdog: batch is not refused, chat's originals come back
    dead.acquire(plan_of(sysfs, 'dmc = "powersave"', "batch"), pid=5, source="launch")
    assert read(sysfs, DMC, "governor") == "powersave"
    assert ledger(run)[str(sysfs / DMC)]["saved"] == [["governor", "dmc_ondemand"]]
    dead.release("batch", pid=5)
    assert read(sysfs, DMC, "governor") == "dmc_ondemand"


def test_the_watchdog_restores_the_clocks_when_the_governor_dies(sysfs: Path, run: Path) -> None:
    before = snapshot(sysfs)
    plan = plan_of(sysfs, 'big = { governor = "userspace", freq = "max" }\nnpu = "performance"')
    for policy in (POLICY4, POLICY6):  # appears once the userspace governor runs
        (sysfs / policy / "scaling_setspeed").write_text("<unsupported>\n")
    watchdog = fork_watchdog()
    try:
        watchdog.arm_clocks(str(run), plan.policy, 31337, str(sysfs))
        BoardClocks(run, sysfs_root=sysfs, alive=_all_alive).acquire(
            plan, pid=31337, source="launch"
        )
        assert read(sysfs, POLICY6, "scaling_setspeed") == "2352000"
    finally:
        assert watchdog.fd is not None
        os.close(watchdog.fd)  # what the kernel does when the governor dies: EOF on the pipe
        _, status = os.waitpid(watchdog.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    restored = snapshot(sysfs)
    for policy in (POLICY4, POLICY6):  # no value to put back: the governor's restore ends it
        restored[f"{policy}/scaling_setspeed"] = before[f"{policy}/scaling_setspeed"]
    assert restored == before
    assert ledger(run) == {}


def test_status_and_diff_show_each_clock_file(sysfs: Path, run: Path) -> None:
    plan = plan_of(sysfs, 'dmc = "performance"\nnpu = { min = "max" }')
    assert [r["state"] for r in oc.observe(plan, run)] == ["not held", "not held"]
    assert len(oc.drift(plan)) == 2

    BoardClocks(run, sysfs_root=sysfs, alive=_all_alive).acquire(plan, pid=None, source="apply")
    rows = oc.observe(plan, run)
    assert [(r["key"], r["state"], r["holders"]) for r in rows] == [
        ("npu", "in sync", ["chat"]),
        ("dmc", "in sync", ["chat"]),
    ]
    assert oc.drift(plan) == []
    (sysfs / DMC / "governor").write_text("dmc_ondemand\n")  # behind the governor's back
    assert oc.observe(plan, run)[1]["state"] == "drifted"
    drift = oc.drift(plan)
    assert drift == [
        {"file": str(sysfs / DMC / "governor"), "plan": "performance", "kernel": "dmc_ondemand"}
    ]
    host = probe(RK3588, sysfs_root=sysfs)
    out = d.report(plan, host, [], None, None, clocks=drift)
    assert out["in_sync"] is False
    assert f"clock {sysfs / DMC}/governor: plan performance, kernel dmc_ondemand" in d.render(out)
    lines = oc.render(oc.observe(plan, run))
    assert lines[1].split() == [
        "clock", "dmc", "dmc", "governor", "performance", "dmc_ondemand", "drifted", "held",
        "by", "chat",
    ]  # fmt: skip


def test_a_failed_restore_is_retried_by_the_next_release_and_stays_visible(
    sysfs: Path, run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from governor.api import operate as api_operate

    clocks = BoardClocks(run, sysfs_root=sysfs, alive=_all_alive)
    plan = plan_of(sysfs, 'dmc = "performance"')
    clocks.acquire(plan, pid=None, source="apply")
    real = kc.write

    def refuse(path: str, value: str) -> None:
        raise kc._translate(OSError(errno.EBUSY, "Device or resource busy"), "write", path, value)

    monkeypatch.setattr(kc, "write", refuse)
    with pytest.raises(BackendError, match="clock restore failed"):
        clocks.release("chat", pid=ANY_PID)
    entry = ledger(run)[str(sysfs / DMC)]
    assert [h["policy"] for h in entry["holders"]] == ["chat"] and entry["failed"]
    rows = oc.observe(plan, run)
    assert rows[0]["holders"] == ["chat"] and rows[0]["restore_failed"]
    assert any("NOT restored" in line for line in oc.render(rows))
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))  # no slice left to show it: status says it
    assert api_operate.status(None) == []
    assert "governor: clock dmc NOT restored (held by chat): " in capsys.readouterr().err

    with pytest.raises(BackendError, match="clock restore failed"):  # tried again, not "done"
        clocks.release("chat", pid=ANY_PID)
    monkeypatch.setattr(kc, "write", real)
    assert clocks.release("chat", pid=ANY_PID) == ["dmc"]
    assert read(sysfs, DMC, "governor") == "dmc_ondemand"
    assert ledger(run) == {}


def _forge(run: Path, devices: dict[str, Any]) -> str:
    run.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": 1, "devices": devices})
    (run / "clocks.json").write_text(text)
    return text


def test_a_forged_ledger_cannot_make_an_acquisition_write_outside_the_sysfs_root(
    sysfs: Path, run: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "governor").write_text("mine\n")
    (outside / "min_freq").write_text("1\n")
    dead = [{"policy": "ghost", "pid": 999999, "source": "launch"}]
    real = str(sysfs / DMC)
    (sysfs / DMC / "max_freq").unlink()
    (sysfs / DMC / "max_freq").symlink_to(outside / "min_freq")  # a link put in by hand
    device = {"key": "dmc", "kind": "devfreq", "name": "dmc", "request": [], "holders": dead}
    forged = {
        str(outside): {**device, "path": str(outside), "saved": [["governor", "x"]]},
        real: {**device, "path": real, "saved": [["max_freq", "7"]]},
        str(sysfs / POLICY4): {
            **device,
            "kind": "cpufreq",
            "path": str(sysfs / POLICY4),
            "saved": [["../../../../../outside/governor", "x"]],
        },
    }
    _forge(run, forged)
    clocks = BoardClocks(run, sysfs_root=sysfs, alive=lambda pid: pid != 999999)
    clocks.acquire(plan_of(sysfs, 'little = "performance"'), pid=5, source="launch")
    assert (outside / "governor").read_text() == "mine\n"
    assert (outside / "min_freq").read_text() == "1\n"
    kept = ledger(run)
    assert kept[str(outside)] == forged[str(outside)]  # never acted on, never dropped
    assert kept[str(sysfs / POLICY4)] == forged[str(sysfs / POLICY4)]
    assert "outside the sysfs root" in kept[real]["failed"][0]  # the link: refused at write
    reader = Ledger(run, sysfs)
    reader.read()
    assert len(reader.problems) == 2  # the outside path and the file that is not a role file
    with pytest.raises(BackendError, match="cannot read") as err:  # a device it names: refused
        clocks.acquire(plan_of(sysfs, 'big = "performance"'), pid=5, source="launch")
    assert err.value.exit_code == 71 and "not a cpufreq clock file" in str(err.value)


@pytest.mark.parametrize("text", [b'{"format": 1, "devi', b"\xff\xfe", b"[1, 2]", b"null"])
def test_a_ledger_that_is_not_one_is_refused_and_kept(sysfs: Path, run: Path, text: bytes) -> None:
    run.mkdir()
    (run / "clocks.json").write_bytes(text)
    clocks = BoardClocks(run, sysfs_root=sysfs, alive=_all_alive)
    with pytest.raises(BackendError, match="not a ledger") as err:
        clocks.acquire(plan_of(sysfs, 'dmc = "performance"'), pid=5, source="launch")
    assert err.value.exit_code == 71
    assert (run / "clocks.json").read_bytes() == text
    assert read(sysfs, DMC, "governor") == "dmc_ondemand"
    reader = Ledger(run)
    assert reader.read() == {} and "not a ledger" in reader.problems[0]
    rows = oc.observe(plan_of(sysfs, 'dmc = "performance"'), run)
    assert rows[0]["state"] == "not held"
