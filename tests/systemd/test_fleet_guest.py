"""The Ansible module governor.board.policy on a live board, for real: ansible-playbook (`-c
local`, the checkout as ANSIBLE_COLLECTIONS_PATH) against systemd 252 as PID 1 in the guest,
with llama-server (the small kvguest model) as the engine. One playbook tells the story:

install + start (the service is ready: /health 200) -> a second run is ok -> the policy's
memory.high changes -> check mode shows it and the board is untouched (slice file and kernel)
-> apply with live: tuned in place through the manager with --confirm and confirmed, the engine
NOT restarted (same MainPID), kernel and `systemctl show` at the new value -> ok again ->
state: absent stops and uninstalls -> absent again is ok; /etc is as before and no cgroup is left.

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
from helpers.units import systemctl_show

from governor.backends import unitmap

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
    pid = {"ansible.builtin.command": f"systemctl show -p MainPID --value {unit}"}
    high = {"ansible.builtin.slurp": {"src": str(slice_dir / "memory.high")}}
    tasks: list[dict[str, Any]] = [
        {"governor.board.policy": {"policy": p, "started": True}, "register": "up"},
        {**pid, "register": "pid_up"},
        {
            "ansible.builtin.uri": {"url": f"http://127.0.0.1:{port}/health"},
            "register": "health",
        },
        {"governor.board.policy": {"policy": p, "started": True}, "register": "again"},
        {"ansible.builtin.copy": {"dest": p, "content": POLICY.format(name=name, high="250M")}},
        {
            "governor.board.policy": {"policy": p, "started": True, "live": True},
            "check_mode": True,
            "register": "check",
        },
        {**high, "register": "high_check"},
        {"governor.board.policy": {"policy": p, "started": True, "live": True}, "register": "live"},
        {**high, "register": "high_live"},
        {**pid, "register": "pid_live"},
        {"governor.board.policy": {"policy": p, "started": True, "live": True}, "register": "ok"},
        {"governor.board.policy": {"policy": p, "state": "absent"}, "register": "gone"},
        {"governor.board.policy": {"policy": p, "state": "absent"}, "register": "gone2"},
    ]
    defaults = {"executable": str(GOVERNOR), "engine": engine}
    try:
        r, run = run_play(tmp_path, tasks, defaults=defaults)
    finally:
        subprocess.run(["systemctl", "stop", unit], check=False, capture_output=True)
        subprocess.run([str(GOVERNOR), "uninstall", name], check=False, capture_output=True)
    assert run.returncode == 0, run.stdout + run.stderr
    # install + start: ready once /health answered
    assert r["up"]["changed"] and r["up"]["service"] == "started", r["up"]
    assert r["health"]["status"] == 200
    assert not r["again"]["changed"], r["again"]
    # check mode: the change and the live tune it would make; the kernel keeps the old value
    assert r["check"]["changed"] and r["check"]["tuned"] == [f"memory.high={250 * MIB}"]
    assert "service" not in r["check"]  # no restart planned
    assert _slurped(r["high_check"]) == str(300 * MIB)
    # live: tuned in place, confirmed, same engine process
    assert r["live"]["changed"] and r["live"]["tuned"] == [f"memory.high={250 * MIB}"]
    assert "service" not in r["live"], r["live"]
    assert _slurped(r["high_live"]) == str(250 * MIB)
    assert r["pid_live"]["stdout"] == r["pid_up"]["stdout"] != "0"
    assert not r["ok"]["changed"], r["ok"]
    assert r["ok"]["drift"]["systemd"] == [], r["ok"]["drift"]  # unit files match the policy
    # absent: stopped and uninstalled, then ok
    assert r["gone"]["changed"] and r["gone"]["service"] == "stopped"
    assert not r["gone2"]["changed"]
    assert systemctl_show(unit, "ActiveState")["ActiveState"] == "inactive"
    assert not slice_dir.exists()
    assert _tree() == before


def _slurped(result: dict[str, Any]) -> str:
    import base64

    return base64.b64decode(result["content"]).decode().strip()
