"""Deploying with systemd, for real (systemd >= 252 as PID 1 in the qemu guest):

- one installed service's life: `governor install` -> `systemctl start governor@<policy>` with a
  small engine: the limits read back through BOTH `systemctl show` and cgroupfs match the plan,
  the governor sits in <unit>/supervisor and the engine in <unit>/engine (with memory.oom.group
  there); GOVERNOR_METRICS in /etc/governor/<policy>.env: the service answers /metrics with the
  policy's series and `governor status` shows a launch under systemd; `systemctl stop` cleans
  up; the policy broken since makes the next start fail once with 65 and not restart;
  `governor uninstall` leaves /etc as it was (file lists compared);
- a transient-scope launch (--backend auto, which picks systemd here: PID 1 is systemd and the
  bus answers; D-Bus via pystemd) and a cgroupfs launch of the same policy produce the same
  cgroup values (the installed service above is --backend systemd).

Runs in the systemd guest: flock /tmp/governor-guest.lock scripts/test --tier systemd -k deploy
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.units import installed, systemctl_show

from governor.compile.compiler import compile_plan
from governor.plan import unitmap
from governor.plan.host import probe
from governor.plan.model import Plan
from governor.policy.loader import load

pytestmark = pytest.mark.systemd(min_version=252)

REPO = Path(__file__).resolve().parents[2]
GOVERNOR = [sys.executable, "-m", "governor"]
TIMEOUT = 300
WATCHED = (Path("/etc/systemd/system"), Path("/etc/governor"))

POLICY = """\
name = "{name}"
slice = "governor.slice"
[memory]
min = "16M"
high = "200M"
max = "256M"
swap_max = "0"
oom_group = true
[cpu]
cpus = "1"
weight = 150
max = "150%"
[io]
weight = 60
[pids]
max = 64
[process]
oom_score_adj = 200
"""

# the engine: prints where it runs and the limits of its cgroup and its parent, then waits
DUMP = """
import json, os, sys, time
cg = open("/proc/self/cgroup").read().split("::", 1)[1].strip()
root = "/sys/fs/cgroup"
def files(path):
    out = {}
    for f in ("pids.max", "memory.min", "memory.high", "memory.max", "memory.swap.max",
              "memory.oom.group", "cpu.weight", "cpu.max", "cpuset.cpus", "io.weight"):
        try:
            out[f] = open(f"{root}{path}/{f}").read().strip()
        except OSError:
            out[f] = None
    return out
parent = cg.rsplit("/", 1)[0]
top = parent.rsplit("/", 1)[0]
json.dump({"cgroup": cg, "leaf": files(cg), "parent": files(parent), "top": files(top)},
          open(sys.argv[1], "w"))
time.sleep(float(sys.argv[2]))
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


def _plan(policy_file: Path) -> Plan:
    return compile_plan(load(policy_file), probe("/"), source=str(policy_file))


@pytest.fixture
def policy(tmp_path: Path) -> Iterator[Path]:
    name = f"gt-{uuid.uuid4().hex[:8]}"  # a dash: the slice name must escape it
    path = tmp_path / f"{name}.toml"
    path.write_text(POLICY.format(name=name))
    yield path
    unit = unitmap.service_unit(name)
    _run("systemctl", "stop", unit, check=False)
    _run("systemctl", "reset-failed", unit, check=False)
    _env_file(name).unlink(missing_ok=True)
    if installed(name):  # the test's own uninstall did not run
        _run(*GOVERNOR, "uninstall", name, check=False)


def _env_file(name: str) -> Path:
    return Path("/etc/governor") / f"{name}.env"


def _kernel_values(plan: Plan) -> dict[str, str]:
    """file -> value as the plan writes it (cpuset lists compared as written)."""
    return {w.file: w.value for w in plan.writes}


def test_installed_service_runs_under_the_plan_serves_metrics_fails_once_on_a_bad_policy_and_uninstalls(
    policy: Path, cgroup2_root: Path, tmp_path: Path
) -> None:
    """One installed service, its whole life (each install + uninstall costs ~20 s under TCG,
    so the stories share it): the engine under the plan, /metrics from the env file, stop, a
    start with the policy broken since, uninstall."""
    before = _tree()
    name = policy.stem
    out = tmp_path / "dump.json"
    engine = [sys.executable, "-c", DUMP, str(out), "600"]
    inst = _run(*GOVERNOR, "install", str(policy), "--", *engine)
    assert "governor@" in inst.stdout, inst.stdout + inst.stderr
    again = _run(*GOVERNOR, "install", str(policy), "--", *engine)
    assert "0 file(s) changed" in again.stdout  # idempotent
    # GOVERNOR_METRICS in /etc/governor/<name>.env (what the unit file documents)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _env_file(name).write_text(f"GOVERNOR_METRICS=127.0.0.1:{port}\n")

    unit = unitmap.service_unit(name)
    plan = _plan(policy)
    slice_unit = unitmap.policy_slice(plan.slice, name)
    unit_dir = cgroup2_root / unitmap.service_cgroup(plan)

    start = _run("systemctl", "start", unit, check=False)  # Type=notify: returns on READY=1
    assert start.returncode == 0, start.stderr + _run("journalctl", "-u", unit, "-n", "60").stdout
    state = systemctl_show(unit, "ActiveState", "MainPID", "ControlGroup")
    assert state["ActiveState"] == "active"
    assert state["ControlGroup"] == f"/{unitmap.service_cgroup(plan)}"
    main_pid = int(state["MainPID"])
    assert main_pid in cgroups.pids(unit_dir / "supervisor")
    assert cgroups.pids(unit_dir) == []  # no internal processes
    cgroups.wait_for(lambda: out.exists() and out.stat().st_size > 0, TIMEOUT, "engine dump")
    dump = json.loads(out.read_text())
    assert dump["cgroup"] == f"/{unitmap.service_cgroup(plan)}/engine"
    assert dump["leaf"]["memory.oom.group"] == "1"
    _check_limits(plan, cgroup2_root, slice_unit, unit)
    _check_metrics(name, port)

    stop = _run("systemctl", "stop", unit, check=False)
    assert stop.returncode == 0, stop.stderr
    cgroups.wait_for(lambda: not unit_dir.exists(), TIMEOUT, f"{unit_dir} to be removed")
    assert systemctl_show(unit, "ActiveState")["ActiveState"] == "inactive"
    _env_file(name).unlink()
    _check_a_bad_policy_fails_once(policy, unit)

    _run(*GOVERNOR, "uninstall", str(policy))
    _run("systemctl", "stop", slice_unit, check=False)
    assert _tree() == before


def _check_limits(plan: Plan, cgroup2_root: Path, slice_unit: str, unit: str) -> None:
    """The plan's limits on the running service's policy slice, through cgroupfs and through
    systemd's own view; governor.slice's protection; the unit's own settings."""
    slice_dir = cgroup2_root / unitmap.slice_cgroup(slice_unit)
    want = _kernel_values(plan)
    for file, value in want.items():
        if file == "memory.oom.group":
            continue
        live = cgroups.read(slice_dir / file)
        if file == "io.weight":
            live = live.splitlines()[0]
        assert live == value, (file, live, value)
    props = systemctl_show(
        slice_unit, "MemoryMin", "MemoryHigh", "MemoryMax", "MemorySwapMax", "TasksMax",
        "CPUWeight", "CPUQuotaPerSecUSec", "AllowedCPUs", "IOWeight",
    )  # fmt: skip
    assert props["MemoryMin"] == want["memory.min"]
    assert props["MemoryHigh"] == want["memory.high"]
    assert props["MemoryMax"] == want["memory.max"]
    assert props["MemorySwapMax"] == want["memory.swap.max"]
    assert props["TasksMax"] == want["pids.max"]
    assert props["CPUWeight"] == want["cpu.weight"]
    assert props["CPUQuotaPerSecUSec"] == "1.500000s"
    assert props["AllowedCPUs"] == want["cpuset.cpus"]
    assert props["IOWeight"] == want["io.weight"].split()[1]
    # governor.slice grants the policy slice's protection (a parent caps its children's):
    # raised at start through the manager (set-property --runtime), so systemd agrees
    top = cgroups.read(cgroup2_root / "governor.slice" / "memory.min")
    assert int(top) >= int(want["memory.min"]), top
    assert systemctl_show("governor.slice", "MemoryMin")["MemoryMin"] == top
    svc = systemctl_show(unit, "OOMScoreAdjust", "Delegate", "Type", "OOMPolicy")
    assert svc == {"OOMScoreAdjust": "200", "Delegate": "yes", "Type": "notify",
                   "OOMPolicy": "continue"}  # fmt: skip


def _check_metrics(name: str, port: int) -> None:
    """The running service answers /metrics with the policy's series; `governor status` shows
    it as a launch under systemd."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    got: dict[tuple[str, str], float] = {}

    def scraped() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return False
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.labels.get("policy") == name:
                    got[(smp.name, smp.labels.get("limit", ""))] = smp.value
        return ("governor_engine_up", "") in got

    cgroups.wait_for(scraped, TIMEOUT, "the service's /metrics")
    assert got[("governor_engine_up", "")] == 1
    assert got[("governor_memory_limit_bytes", "max")] == 256 << 20
    status = _run(*GOVERNOR, "status", name, "--json")
    (item,) = json.loads(status.stdout)
    assert (item["source"], item["backend"], item["state"]) == (
        "launch", "systemd", "running"
    ), item  # fmt: skip
    assert item["systemd_unit"] is not None


def _check_a_bad_policy_fails_once(policy: Path, unit: str) -> None:
    """The policy broken since the install: the service fails once with 65, no restart."""
    good = policy.read_text()
    policy.write_text(good + "\n[memory]\nbogus = 1\n")  # now invalid
    start = _run("systemctl", "start", unit, check=False)
    assert start.returncode != 0
    # no waiting: a restart the unit would make (Restart=on-failure, RestartSec=100ms) is
    # scheduled as the service dies (ActiveState "activating", SubState "auto-restart"), before
    # the start job fails; "failed" is final, nothing restarts a failed unit without a new job
    state = systemctl_show(unit, "ActiveState", "Result", "ExecMainStatus", "NRestarts")
    assert state["ExecMainStatus"] == "65", state
    assert state["NRestarts"] == "0", state
    assert state["ActiveState"] == "failed", state
    policy.write_text(good)  # uninstall reads the policy's name from the file


def test_transient_scope_and_cgroupfs_launch_write_the_same_values(
    tmp_path: Path, cgroup2_root: Path
) -> None:
    name = f"gs-{uuid.uuid4().hex[:8]}"
    slice_unit = f"gtest{uuid.uuid4().hex[:8]}.slice"
    path = tmp_path / f"{name}.toml"
    path.write_text(POLICY.format(name=name).replace("governor.slice", slice_unit))
    dumps = {}
    try:
        for backend in ("cgroupfs", "auto"):
            out = tmp_path / f"{backend}.json"
            run = _run(
                *GOVERNOR, "launch", "--backend", backend, "--policy", str(path), "--",
                sys.executable, "-c", DUMP, str(out), "0",
                check=False,
            )  # fmt: skip
            assert run.returncode == 0, run.stderr
            dumps[backend] = json.loads(out.read_text())
    finally:
        _run("systemctl", "stop", slice_unit, check=False)
    fs, sd = dumps["cgroupfs"], dumps["auto"]  # auto: the transient scope (systemd)
    assert fs["cgroup"] == f"/{slice_unit}/{name}/engine"
    assert sd["cgroup"] == f"/{slice_unit}/governor-{unitmap.escape(name)}.scope/engine"
    for file in fs["parent"]:
        if file == "memory.oom.group":
            # cgroupfs: on <slice>/<name>; systemd: on the engine leaf (the scope holds the
            # supervising governor too)
            assert fs["parent"][file] == sd["leaf"][file] == "1"
            continue
        assert fs["parent"][file] == sd["parent"][file], file
    assert fs["parent"]["memory.max"] == str(256 << 20)
    # the slice above grants the group's memory.min (cgroupfs: written; systemd: set-property)
    assert fs["top"]["memory.min"] == sd["top"]["memory.min"] == str(16 << 20)
    assert not (cgroup2_root / slice_unit / name).exists()
    assert os.path.exists(cgroup2_root)


# the engine: writes the words it was given after the output path, as JSON
ARGV_DUMP = "import json, sys; json.dump(sys.argv[2:], open(sys.argv[1], 'w'))"
# what unit syntax would change if written raw: variables ($ and ${}), specifiers (%), quotes,
# backslashes, a lone ';' (a command separator), '~', spaces and tabs, an empty word
HOSTILE_WORDS = [
    "$GOVERNOR_POLICY", "${GOVERNOR_POLICY}", "$$", "$", "%n", "100%", 'say "hi"', "it's",
    "back\\slash", "\\n", "tab\there", ";", "a;b", "~", "~/x", " lead", "trail ", "", "ünï",
]  # fmt: skip


def test_an_installed_engine_gets_its_argv_byte_for_byte_through_systemd(
    policy: Path, tmp_path: Path
) -> None:
    """Issue 35 item 6: `governor install POLICY -- ENGINE...` writes ExecStart= so that systemd
    hands the engine exactly the words after `--` ($ doubled, % doubled, quoted and escaped per
    systemd.syntax(7)); the engine here reports its argv, read back after a real start."""
    name = policy.stem
    out = tmp_path / "argv.json"
    engine = [sys.executable, "-c", ARGV_DUMP, str(out), *HOSTILE_WORDS]
    inst = _run(*GOVERNOR, "install", str(policy), "--", *engine)
    assert "governor@" in inst.stdout, inst.stdout + inst.stderr
    unit = unitmap.service_unit(name)
    start = _run("systemctl", "start", unit, check=False)
    journal = _run("journalctl", "-u", unit, "-n", "40", check=False).stdout
    assert start.returncode == 0, start.stderr + journal
    cgroups.wait_for(lambda: out.exists() and out.stat().st_size > 0, TIMEOUT, "engine argv")
    assert json.loads(out.read_text()) == HOSTILE_WORDS
    _run("systemctl", "stop", unit, check=False)
    _run(*GOVERNOR, "uninstall", str(policy))


def test_an_installed_but_stopped_service_keeps_its_claim_against_a_launch(
    policy: Path, tmp_path: Path
) -> None:
    """Issue 36: `governor install` records the slice's claim in its manifest; while the
    service is installed and NOT running, a launch whose memory.min does not fit beside it is
    refused (75) naming it, with nothing applied; once it is uninstalled the launch goes."""
    from governor.board.budget import Budget, gib

    memtotal = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    mib = int(Budget.of(memtotal).budget * 0.6) >> 20
    name = policy.stem
    # its memory.min alone (high and max stay unset: a min above them would be refused, 65)
    policy.write_text(f'name = "{name}"\nslice = "governor.slice"\n[memory]\nmin = "{mib}M"\n')
    _run(*GOVERNOR, "install", str(policy))
    other = tmp_path / "gt-admit.toml"
    other.write_text(f'name = "gt-admit"\n[memory]\nmin = "{mib}M"\n')
    launch = [
        *GOVERNOR,
        "launch",
        "--backend",
        "cgroupfs",
        "--policy",
        str(other),
        "--",
        "/bin/true",
    ]
    refused = _run(*launch, check=False)
    assert refused.returncode == 75, refused.stderr
    line = refused.stderr.splitlines()[0]
    assert line.startswith("governor: the board cannot admit gt-admit: memory.min "), line
    assert f"({name} holds {gib(mib << 20)}, installed)" in line  # MiB below 2 GiB
    assert not Path("/sys/fs/cgroup/governor.slice/gt-admit").exists()
    _run(*GOVERNOR, "uninstall", name)
    admitted = _run(*launch, check=False)
    assert admitted.returncode == 0, admitted.stderr
