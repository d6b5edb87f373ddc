"""The Ansible module governor.board.policy on a live board, for real: ansible-playbook (`-c
local`, the checkout as ANSIBLE_COLLECTIONS_PATH) against systemd 252 as PID 1 in the guest,
with llama-server (the small kvguest model) as the engine. One playbook tells the story:

install + start (Type=notify: ready once /health answered) -> a second run is ok -> the
policy's memory.high changes -> check mode shows it (and `governor diff --json` the slice file's
drift) and the board is untouched (kernel and manager) -> apply with live: tuned in place
through the manager with --confirm and confirmed, the engine NOT restarted (same MainPID), kernel
and `systemctl show` at the new value -> state: absent stops and uninstalls; /etc is as before
and no cgroup is left. (Idempotence after a change and absent twice: the host test.) Snapshots
between steps are `raw` tasks: each module run costs seconds under TCG.

Runs in the systemd guest: flock /tmp/governor-guest.lock scripts/test --tier systemd -k fleet
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers.ansible import run_play
from helpers.server import KVGUEST, SERVER, free_port, server_argv
from helpers.units import installed, systemctl_show

from governor.plan import unitmap

pytestmark = [
    pytest.mark.systemd(min_version=252),
    pytest.mark.engine(binary=SERVER, paths=(KVGUEST,)),
]

GOVERNOR = Path(sys.executable).with_name("governor")
WATCHED = (Path("/etc/systemd/system"), Path("/etc/governor"))
MIB = 1 << 20
POLICY = """\
name = "{name}"
slice = "governor.slice"
[memory]
high = "{high}"
max = "400M"
swap_max = "0"
[engine]
kind = "llama.cpp"
max_context_tokens = 1024
max_cache_ram = 16
ready_timeout = "240s"
"""


def _tree() -> dict[str, str]:
    out: dict[str, str] = {}
    for base in WATCHED:
        if base.exists():
            for p in sorted(base.rglob("*")):
                out[str(p)] = p.read_text() if p.is_file() and not p.is_symlink() else "<dir>"
    return out


def test_a_playbook_installs_starts_tunes_live_and_removes_a_server(
    tmp_path: Path, cgroup2_root: Path
) -> None:
    before = _tree()
    name = f"fl-{uuid.uuid4().hex[:8]}"
    unit = unitmap.service_unit(name)
    slice_unit = unitmap.policy_slice("governor.slice", name)
    slice_dir = cgroup2_root / unitmap.slice_cgroup(slice_unit)
    policy = tmp_path / f"{name}.toml"
    policy.write_text(POLICY.format(name=name, high="300M"))
    port = free_port()
    engine = server_argv(KVGUEST, port, "-c", "1024", "-np", "1", "--cache-ram", "16", "-t", "2")
    p = str(policy)
    changed = tmp_path / "changed.toml"
    changed.write_text(POLICY.format(name=name, high="250M"))
    # raw: a shell command, no module to ship (each module run costs seconds under TCG)
    snap = {
        "ansible.builtin.raw": f"systemctl show -p MainPID --value {unit};"
        f" cat '{slice_dir}/memory.high'; systemctl show -p MemoryHigh --value '{slice_unit}'"
    }
    live = {"policy": p, "started": True, "live": True}
    tasks: list[dict[str, Any]] = [
        {"governor.board.policy": {"policy": p, "started": True}, "register": "up"},
        {**snap, "register": "snap_up"},
        {"governor.board.policy": {"policy": p, "started": True}, "register": "again"},
        {"ansible.builtin.raw": f"cp {changed} {p}"},
        {"governor.board.policy": live, "check_mode": True, "register": "check"},
        {**snap, "register": "snap_check"},
        {"governor.board.policy": live, "register": "live"},
        {**snap, "register": "snap_live"},
        {"governor.board.policy": {"policy": p, "state": "absent"}, "register": "gone"},
    ]
    defaults = {"executable": str(GOVERNOR), "engine": engine}
    try:
        r, run = run_play(tmp_path, tasks, defaults=defaults)
    finally:
        subprocess.run(["systemctl", "stop", unit], check=False, capture_output=True)
        if installed(name):  # the play's absent did not run or failed
            subprocess.run([str(GOVERNOR), "uninstall", name], check=False, capture_output=True)
    assert run.returncode == 0, run.stdout + run.stderr
    # install + start (Type=notify: started once llama-server answered /health), then ok
    assert r["up"]["changed"] and r["up"]["service"] == "started", r["up"]
    pid_up, *high_up = r["snap_up"]["stdout_lines"]
    assert int(pid_up) > 0 and high_up == [str(300 * MIB)] * 2  # kernel, manager
    assert not r["again"]["changed"], r["again"]
    # check mode: the change and the live tune it would make; the board keeps the old value
    assert r["check"]["changed"] and r["check"]["tuned"] == [f"memory.high={250 * MIB}"]
    assert "service" not in r["check"]  # no restart planned
    assert r["check"]["drift"]["systemd"], r["check"]["drift"]  # the slice file differs
    assert r["snap_check"]["stdout_lines"] == [pid_up, *high_up]
    # live: tuned in place through the manager, confirmed, the same engine process
    assert r["live"]["changed"] and r["live"]["tuned"] == [f"memory.high={250 * MIB}"]
    assert "service" not in r["live"], r["live"]
    assert r["snap_live"]["stdout_lines"] == [pid_up, str(250 * MIB), str(250 * MIB)]
    # absent: stopped and uninstalled
    assert r["gone"]["changed"] and r["gone"]["service"] == "stopped"
    assert systemctl_show(unit, "ActiveState")["ActiveState"] == "inactive"
    assert not slice_dir.exists()
    assert _tree() == before
