"""`governor tune` / `rollback` of an installed governor@ service, for real (systemd as PID 1 in
the qemu guest): slice-level knobs go through the manager as runtime properties, so
`systemctl show` agrees with the kernel; `--persist` writes a drop-in on the policy's slice that
survives `systemctl daemon-reload` and a restart of the service; `rollback --all` restores the
kernel, the manager's view and the drop-in; `status` shows the unit's value next to the kernel's;
an unconfirmed `--confirm` tune made from a session that ends right after it is reverted through
the manager by the detached reverter, which outlived the session in a scope of its own.

Runs in the systemd guest: flock /tmp/governor-guest.lock scripts/test --tier systemd -k tune
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import cgroups
from helpers.units import systemctl_show

from governor.deploy.tunedropin import DROPIN_NAME
from governor.plan import unitmap

pytestmark = pytest.mark.systemd(min_version=252)

REPO = Path(__file__).resolve().parents[2]
GOVERNOR = [sys.executable, "-m", "governor"]
TIMEOUT = 300
MIB = 1 << 20
RUN = Path("/run/governor")
# the unconfirmed tune's --confirm window (see its step below)
CONFIRM_WINDOW = "10s"

POLICY = """\
name = "{name}"
slice = "governor.slice"
[memory]
high = "200M"
max = "256M"
[cpu]
weight = 150
"""


def _run(*argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=TIMEOUT, check=check, cwd=REPO
    )
    if list(argv[: len(GOVERNOR)]) == GOVERNOR or argv[0] in ("systemctl", "systemd-run"):
        # a transcript for the README (run with -s to see it)
        shown = " ".join(argv).replace(" ".join(GOVERNOR), "governor")
        print("$ " + shown + "\n" + res.stdout + res.stderr, end="")
    return res


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[str]:
    name = f"tu-{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.toml"
    path.write_text(POLICY.format(name=name))
    _run(*GOVERNOR, "install", str(path), "--", "/bin/sleep", "600", check=True)
    slice_unit = unitmap.policy_slice("governor.slice", name)
    yield name
    _run("systemctl", "stop", unitmap.service_unit(name))
    _run("systemctl", "reset-failed", unitmap.service_unit(name))
    _run(*GOVERNOR, "uninstall", name)
    dropin = Path(f"/etc/systemd/system/{slice_unit}.d/{DROPIN_NAME}")
    if dropin.exists():  # left by a failed test (rollback --all removes it): a reload is ~3 s
        dropin.unlink()
        _run("systemctl", "daemon-reload")
    _run("systemctl", "stop", slice_unit)


def _last_entry(name: str) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads((RUN / name / "journal.jsonl").read_text().splitlines()[-1])
    return entry


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _start(unit: str) -> None:
    start = _run("systemctl", "start", unit)
    assert start.returncode == 0, start.stderr + _run("journalctl", "-u", unit, "-n", "60").stdout


def test_tune_goes_through_the_manager_persists_a_drop_in_and_rolls_back(
    installed: str, cgroup2_root: Path
) -> None:
    name = installed
    unit = unitmap.service_unit(name)
    slice_unit = unitmap.policy_slice("governor.slice", name)
    slice_dir = cgroup2_root / unitmap.slice_cgroup(slice_unit)
    conf = Path(f"/etc/systemd/system/{slice_unit}.d/{DROPIN_NAME}")
    _start(unit)
    cgroups.wait_for((RUN / name / "state.json").exists, TIMEOUT, "the service's state")

    def agree(high: int, weight: int) -> None:
        """The kernel and the manager say the same, and say this."""
        props = systemctl_show(slice_unit, "MemoryHigh", "CPUWeight")
        assert props == {"MemoryHigh": str(high), "CPUWeight": str(weight)}, props
        assert cgroups.read(slice_dir / "memory.high") == str(high)
        assert cgroups.read(slice_dir / "cpu.weight") == str(weight)

    agree(200 * MIB, 150)
    # runtime tune through the manager
    done = _run(*GOVERNOR, "tune", name, "memory.high=150M", "cpu.weight=300")
    assert done.returncode == 0, done.stderr
    assert f"(via {slice_unit})" in done.stdout, done.stdout
    agree(150 * MIB, 300)
    (item,) = json.loads(_run(*GOVERNOR, "status", name, "--json").stdout)
    assert item["systemd_unit"] == slice_unit
    knob = next(k for k in item["knobs"] if k["file"] == "memory.high")
    assert (knob["policy"], knob["kernel"], knob["unit"], knob["state"]) == (
        str(200 * MIB), str(150 * MIB), str(150 * MIB), "tuned",
    )  # fmt: skip
    # --persist: the drop-in, diff shown; it survives daemon-reload and a restart
    kept = _run(*GOVERNOR, "tune", name, "memory.high=120M", "--persist")
    assert kept.returncode == 0, kept.stderr
    assert f"+MemoryHigh={120 * MIB}" in kept.stdout, kept.stdout
    assert f"MemoryHigh={120 * MIB}" in conf.read_text()
    agree(120 * MIB, 300)
    assert _run("systemctl", "daemon-reload").returncode == 0
    agree(120 * MIB, 300)
    restart = _run("systemctl", "restart", unit)
    assert restart.returncode == 0, restart.stderr
    assert systemctl_show(unit, "ActiveState")["ActiveState"] == "active"
    agree(120 * MIB, 300)
    # rollback --all: back through the manager, the drop-in removed
    cgroups.wait_for((RUN / name / "state.json").exists, TIMEOUT, "the restarted state")
    back = _run(*GOVERNOR, "rollback", name, "--all")
    assert back.returncode == 0, back.stderr
    assert not conf.exists()
    agree(200 * MIB, 150)
    assert _run("systemctl", "daemon-reload").returncode == 0
    agree(200 * MIB, 150)
    status = _run(*GOVERNOR, "status", name)
    assert "unit" in status.stdout and "in sync" in status.stdout, status.stdout
    # --confirm, not confirmed, from a login session that ends right after the tune (logind's
    # KillUserProcesses=yes stops the session's scope): the reverter moved to a scope of its
    # own, survives the stop and goes back through the manager. The window only has to outlast
    # the tune's own exit and the checks up to the 170M read below (2.4 s of it under TCG, printed
    # with -s); waiting it out is most of this test's time.
    session = f"gtest-session-{uuid.uuid4().hex[:6]}.scope"
    made = _run(
        "systemd-run", "--scope", "--quiet", "--unit", session,
        *GOVERNOR, "tune", name, "memory.high=170M", "--confirm", CONFIRM_WINDOW,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    tuned = _last_entry(name)
    assert tuned["source"] == "tune", tuned
    reverter, scope = tuned["reverter_pid"], tuned.get("reverter_unit")
    assert scope == f"governor-confirm-{name}-{reverter}.scope", tuned
    assert f"/{scope}" in Path(f"/proc/{reverter}/cgroup").read_text()
    _run("systemctl", "stop", session)  # the session's end: gone already, or stopped now
    assert systemctl_show(session, "ActiveState")["ActiveState"] != "active"
    assert b"governor.operate.confirm" in _cmdline(reverter), (
        f"the reverter is gone after the session's stop (or its {CONFIRM_WINDOW} ran out first)"
    )
    assert cgroups.read(slice_dir / "memory.high") == str(170 * MIB), (
        f"reverted before the session's stop was checked: {CONFIRM_WINDOW} ran out first"
    )
    assert systemctl_show(slice_unit, "MemoryHigh")["MemoryHigh"] == str(170 * MIB)
    print(f"(the --confirm window had {tuned['confirm_by'] - time.time():.1f} s left)")
    # the reverter journals after its last write: wait for the entry, then check the values
    cgroups.wait_for(
        lambda: _last_entry(name)["source"] == "rollback", TIMEOUT, "the reverter that outlived it"
    )
    assert systemctl_show(slice_unit, "MemoryHigh")["MemoryHigh"] == str(200 * MIB)
    assert cgroups.read(slice_dir / "memory.high") == str(200 * MIB)
    last = _last_entry(name)
    assert last.get("reason") == "not confirmed", last
    assert last["changes"][0]["unit"] == slice_unit
