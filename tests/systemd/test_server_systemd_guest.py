"""llama-server as a `governor@` service (issue 22), for real: systemd 252 as PID 1 in the guest.

- `systemctl start governor@NAME` returns once the server answers /health 200 (READY=1 waits
  for it: Type=notify), not at exec while it still loads (503);
- a crashed engine (SIGKILL) fails the governor with its status and the unit restarts it;
- `systemctl stop` sends SIGTERM through the governor to the server, which exits 0, and the
  unit's result is success (the status passed on);
- stop + `governor uninstall` leave nothing: no unit file or drop-in, no active policy slice, no
  cgroup.

Runs in the systemd guest: flock /tmp/governor-guest.lock scripts/test --tier systemd -k server
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.server import KVGUEST, SERVER, free_port, health, server_argv
from helpers.units import installed, systemctl_show

from governor.plan import unitmap

pytestmark = [
    pytest.mark.systemd(min_version=252),
    pytest.mark.engine(binary=SERVER, paths=(KVGUEST,)),
]

REPO = Path(__file__).resolve().parents[2]
GOVERNOR = [sys.executable, "-m", "governor"]
TIMEOUT = 300
WATCHED = (Path("/etc/systemd/system"), Path("/etc/governor"))

POLICY = """\
name = "{name}"
slice = "governor.slice"
[memory]
max = "400M"
swap_max = "0"
oom_group = true
[engine]
kind = "llama.cpp"
max_context_tokens = 1024
max_cache_ram = 16
ready_timeout = "240s"
"""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=TIMEOUT, check=check, cwd=REPO
    )


def _tree() -> dict[str, str]:
    out: dict[str, str] = {}
    for base in WATCHED:
        if base.exists():
            for p in sorted(base.rglob("*")):
                out[str(p)] = p.read_text() if p.is_file() and not p.is_symlink() else "<dir>"
    return out


@pytest.fixture
def policy(tmp_path: Path) -> Iterator[Path]:
    name = f"gs-{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.toml"
    path.write_text(POLICY.format(name=name))
    yield path
    unit = unitmap.service_unit(name)
    _run("systemctl", "stop", unit, check=False)
    _run("systemctl", "reset-failed", unit, check=False)
    if installed(name):  # the test's own uninstall did not run
        _run(*GOVERNOR, "uninstall", name, check=False)


def _journal(unit: str) -> str:
    return _run("journalctl", "-u", unit, "-n", "80", "--no-pager", check=False).stdout


def test_a_server_service_is_started_when_ready_restarted_on_a_crash_and_leaves_nothing(
    policy: Path, cgroup2_root: Path
) -> None:
    before = _tree()
    name = policy.stem
    unit = unitmap.service_unit(name)
    slice_unit = unitmap.policy_slice("governor.slice", name)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    engine = server_argv(KVGUEST, port, "-c", "1024", "-np", "1", "--cache-ram", "16", "-t", "2")
    _run(*GOVERNOR, "install", str(policy), "--", *engine)
    drop_in = Path(f"/etc/systemd/system/{unit}.d/50-governor.conf").read_text()
    assert "TimeoutStartSec=300s" in drop_in  # ready_timeout 240 s + 60 s: systemd waits longer

    start = _run("systemctl", "start", unit, check=False)  # returns on READY=1
    assert start.returncode == 0, start.stderr + _journal(unit)
    assert health(base) == 200  # ready means the model is loaded, not that it was exec'd
    state = json.loads(Path(f"/run/governor/{name}/state.json").read_text())
    assert state["ready"] is True, state
    first = systemctl_show(unit, "MainPID", "NRestarts")
    assert first["NRestarts"] == "0"

    # a crash: the engine dies of SIGKILL, the governor exits 128+9, the unit restarts it
    leaf = cgroup2_root / unitmap.slice_cgroup(slice_unit) / unit / "engine"
    (engine_pid,) = cgroups.pids(leaf)
    os.kill(engine_pid, signal.SIGKILL)
    deadline = time.monotonic() + TIMEOUT
    while True:
        now = systemctl_show(unit, "ActiveState", "MainPID", "NRestarts")
        if now["NRestarts"] == "1" and now["ActiveState"] == "active":
            break
        assert time.monotonic() < deadline, (now, _journal(unit))
        time.sleep(0.5)
    assert now["MainPID"] != first["MainPID"]
    assert health(base) == 200  # active again only once ready again
    assert "status=137" in _journal(unit)

    # stop: SIGTERM through the governor; llama-server exits 0 and so does the unit
    stop = _run("systemctl", "stop", unit, check=False)
    assert stop.returncode == 0, stop.stderr
    done = systemctl_show(unit, "ActiveState", "Result", "ExecMainStatus")
    assert done == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, (
        done,
        _journal(unit),
    )

    _run(*GOVERNOR, "uninstall", str(policy))
    assert _tree() == before  # no unit file, no drop-in, no manifest
    assert systemctl_show(slice_unit, "ActiveState")["ActiveState"] == "inactive"
    assert not (cgroup2_root / unitmap.slice_cgroup(slice_unit)).exists()
