"""`governor launch` against a real cgroup v2 kernel (kernel tier, in the guest).

Each test writes a policy whose slice is the test's scratch slice, runs the governor as a
subprocess (as users do) and asserts on the kernel's files and on the process's exit status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice

ALL = ("memory", "cpu", "cpuset", "io", "pids")
HELPERS = Path(__file__).resolve().parents[1] / "helpers"
REPO = Path(__file__).resolve().parents[2]


def _policy(tmp_path: Path, slice_: ScratchSlice, body: str, name: str = "eng") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nslice = "{slice_.name}"\n' + textwrap.dedent(body))
    return path


def _governor(*args: str) -> list[str]:
    return [sys.executable, "-m", "governor", *args]


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _governor(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False
    )


def _leftovers(slice_: ScratchSlice) -> list[str]:
    if not slice_.path.exists():
        return []
    return [str(p.relative_to(slice_.root)) for p in cgroups.subtree_dirs(slice_.path)]


@pytest.mark.compat
@pytest.mark.kernel(controllers=ALL, root=True)
def test_launch_enables_controllers_itself_and_limits_read_back(
    tmp_path: Path, scratch_slice: ScratchSlice, empty_root_subtree: Path
) -> None:
    policy = _policy(
        tmp_path,
        scratch_slice,
        """
        [memory]
        min = "16M"
        high = "100000000"
        max = "200M"
        swap_max = "0"
        oom_group = true
        [cpu]
        cpus = "1-2"
        weight = 300
        max = "150%"
        [pids]
        max = 64
        """,
    )
    assert cgroups.read(empty_root_subtree / "cgroup.subtree_control") == ""
    # its slice exists without the controllers, as when another launch has just made it and
    # not yet enabled them in the root (two services started at once): this launch enables
    # them itself and is not refused (it was: exit 69, "controller memory is not available")
    assert cgroups.read(scratch_slice.create() / "cgroup.controllers") == ""
    res = _run("launch", "--policy", str(policy), "--keep", "--", "true")
    assert res.returncode == 0, res.stderr
    group = scratch_slice.path / "eng"
    assert cgroups.read(group / "memory.min") == str(16 << 20)
    assert cgroups.read(group / "memory.high") == str(100000000 // 4096 * 4096)
    assert cgroups.read(group / "memory.max") == str(200 << 20)
    assert cgroups.read(group / "memory.swap.max") == "0"
    assert cgroups.read(group / "memory.oom.group") == "1"
    assert cgroups.read(group / "cpuset.cpus") == "1-2"
    assert cgroups.read(group / "cpu.weight") == "300"
    assert cgroups.read(group / "cpu.max") == "150000 100000"
    assert cgroups.read(group / "pids.max") == "64"
    enabled = set(cgroups.read(empty_root_subtree / "cgroup.subtree_control").split())
    assert {"memory", "cpu", "cpuset", "pids"} <= enabled
    # `governor remove` takes away all it made; the slice it found is not its to remove
    res = _run("remove", str(policy))
    assert res.returncode == 0, res.stderr
    assert _leftovers(scratch_slice) == [scratch_slice.name]


def _kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int(minor)


@pytest.mark.compat
@pytest.mark.kernel(controllers=ALL, root=True)
def test_oom_group_kills_the_engine_tree_and_only_it(
    tmp_path: Path, scratch_slice: ScratchSlice, spawn: cgroups.Spawn
) -> None:
    policy = _policy(
        tmp_path,
        scratch_slice,
        """
        [memory]
        max = "64M"
        swap_max = "0"
        oom_group = true
        """,
    )
    bystander = spawn(["sleep", "600"])
    report = tmp_path / "report.json"
    res = _run(
        "launch",
        "--policy",
        str(policy),
        "--report",
        str(report),
        "--",
        sys.executable,
        str(HELPERS / "hog.py"),
        "--mib",
        "200",
        "--children",
        "2",
    )
    assert res.returncode == 137, res.stderr
    data = json.loads(report.read_text())
    assert data["oom_kill"] >= 1
    if _kernel() >= (5, 17):  # memory.events has oom_group_kill from 5.17
        assert data["oom_group_kill"] >= 1
    else:  # not counted rather than a wrong 0 (the group kill: exit 137, no cgroup left)
        assert data["oom_group_kill"] is None
    assert data["signal"] == signal.SIGKILL
    if _kernel() >= (5, 19):
        assert data["memory_peak"] >= 60 << 20
    else:  # memory.peak is 5.19+: the report says it has none rather than a wrong number
        assert data["memory_peak"] is None
    assert bystander.poll() is None, "a process outside the slice was killed"
    assert _leftovers(scratch_slice) == []


@pytest.mark.kernel(controllers=ALL, root=True)
def test_engine_sees_pinned_cpus_oom_score_adj_and_user(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    policy = _policy(
        tmp_path,
        scratch_slice,
        """
        [cpu]
        cpus = "1,3"
        [process]
        user = "nobody"
        oom_score_adj = 321
        nice = 5
        """,
    )
    script = (
        "grep Cpus_allowed_list /proc/self/status; cat /proc/self/oom_score_adj; id -u;"
        " cut -d' ' -f19 /proc/self/stat; cat /proc/self/cgroup"
    )
    res = _run("launch", "--policy", str(policy), "--", "/bin/sh", "-c", script)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split("\n")
    assert lines[0].split() == ["Cpus_allowed_list:", "1,3"]
    assert lines[1] == "321"
    assert lines[2] == str(65534)
    assert lines[3] == "5"
    assert lines[4] == f"0::/{scratch_slice.name}/eng/engine"
    assert _leftovers(scratch_slice) == []


@pytest.mark.kernel(controllers=ALL, root=True)
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/bin/true"], 0),
        (["/bin/sh", "-c", "exit 3"], 3),
        (["/etc/hostname"], 126),
        (["/nonexistent/engine"], 127),
        (["/bin/sh", "-c", "kill -TERM $$"], 128 + signal.SIGTERM),
        (["/bin/sh", "-c", "kill -KILL $$"], 128 + signal.SIGKILL),
    ],
)
def test_exit_status_passes_through_and_nothing_is_left(
    tmp_path: Path, scratch_slice: ScratchSlice, argv: list[str], expected: int
) -> None:
    policy = _policy(tmp_path, scratch_slice, "[pids]\nmax = 32\n")
    res = _run("launch", "--policy", str(policy), "--", *argv)
    assert res.returncode == expected, res.stderr
    if expected in (126, 127):
        # the one error line (after the launch announcement when exec itself failed)
        errors = [ln for ln in res.stderr.splitlines() if ln.startswith("governor: engine")]
        assert len(errors) == 1, res.stderr
        assert "Traceback" not in res.stderr
    assert _leftovers(scratch_slice) == []


@pytest.mark.kernel(controllers=ALL, root=True)
def test_sigterm_to_governor_reaches_engine(tmp_path: Path, scratch_slice: ScratchSlice) -> None:
    policy = _policy(tmp_path, scratch_slice, "[pids]\nmax = 32\n")
    ready = tmp_path / "ready"
    engine = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
        f"pathlib.Path({str(ready)!r}).write_text('x')\n"
        "time.sleep(600)\n"
    )
    gov = subprocess.Popen(
        _governor("launch", "--policy", str(policy), "--", sys.executable, "-c", engine),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    cgroups.wait_for(lambda: ready.exists() or None, 120, "engine ready")
    gov.send_signal(signal.SIGTERM)
    _, err = gov.communicate(timeout=120)
    assert gov.returncode == 42, err
    assert _leftovers(scratch_slice) == []


@pytest.mark.compat
@pytest.mark.kernel(controllers=ALL, root=True)
def test_governor_sigkill_takes_the_engine_tree_down(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    policy = _policy(tmp_path, scratch_slice, "[pids]\nmax = 32\n")
    pids_file = tmp_path / "pids"
    # the engine forks a grandchild in a new session: only cgroup.kill reaches it (before
    # 5.14, the watchdog's SIGKILL of each pid in the frozen group)
    script = f"setsid sleep 600 & echo $$ $! > {pids_file}; sleep 600"
    gov = subprocess.Popen(
        _governor("launch", "--policy", str(policy), "--", "/bin/sh", "-c", script),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    cgroups.wait_for(
        lambda: (pids_file.exists() and pids_file.read_text().strip()) or None,
        120,
        "engine started",
    )
    engine_pids = [int(p) for p in pids_file.read_text().split()]
    gov.kill()
    gov.wait(timeout=30)

    def dead(pid: int) -> bool:
        # an orphan is reparented to the guest's PID 1; a zombie waiting there is dead
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] == "Z"

    def gone() -> bool | None:
        return all(dead(p) for p in engine_pids) or None

    cgroups.wait_for(gone, 60, "engine tree killed after the governor died")
    cgroups.wait_for(lambda: (not _leftovers(scratch_slice)) or None, 60, "cgroups removed")


@pytest.mark.kernel(controllers=ALL, root=True)
def test_second_launch_of_a_running_policy_fails_clearly(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    policy = _policy(tmp_path, scratch_slice, "[pids]\nmax = 32\n")
    ready = tmp_path / "ready"
    first = subprocess.Popen(
        _governor(
            "launch", "--policy", str(policy), "--", "/bin/sh", "-c", f"touch {ready}; sleep 600"
        ),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        cgroups.wait_for(lambda: ready.exists() or None, 120, "first engine running")
        res = _run("launch", "--policy", str(policy), "--", "/bin/true")
        assert res.returncode == 69, res.stderr
        assert "already running" in res.stderr
        # the first launch is untouched
        assert first.poll() is None
        assert cgroups.pids(scratch_slice.path / "eng" / "engine")
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM
    assert _leftovers(scratch_slice) == []


@pytest.mark.kernel(controllers=ALL, root=True)
def test_missing_controller_fails_closed_and_leaves_nothing(
    tmp_path: Path, scratch_slice: ScratchSlice, enabled_root_subtree: Path
) -> None:
    # a delegated subtree that offers only cpu and pids: memory is not available there
    top = scratch_slice.create()
    cgroups.write(top / "cgroup.subtree_control", "+cpu +pids")
    sub = scratch_slice.child("delegated")
    assert set(cgroups.read(sub / "cgroup.controllers").split()) == {"cpu", "pids"}
    policy = tmp_path / "p.toml"
    policy.write_text('name = "eng"\n[memory]\nmax = "100M"\n[pids]\nmax = 10\n')
    before = sorted(os.listdir(sub))
    res = _run("--cgroup-root", str(sub), "launch", "--policy", str(policy), "--", "/bin/true")
    assert res.returncode == 69, res.stderr
    assert "memory" in res.stderr.splitlines()[0]
    assert "Traceback" not in res.stderr
    assert sorted(os.listdir(sub)) == before
    # --allow-missing runs it degraded and says so
    res = _run(
        "--cgroup-root",
        str(sub),
        "launch",
        "--allow-missing",
        "memory",
        "--policy",
        str(policy),
        "--",
        "/bin/true",
    )
    assert res.returncode == 0, res.stderr
    assert "NOT enforced: memory.max = 104857600 (memory controller missing)" in res.stderr
    assert sorted(os.listdir(sub)) == before


# an engine that answers /health with 503 until the file ARGV[2] exists, then 200
_HEALTH = """
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if os.path.exists(sys.argv[2]) else 503)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.compat
@pytest.mark.kernel(controllers=("memory",), root=True)
def test_ready_is_published_once_the_engine_answers_200_and_sigterm_ends_the_run(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    """`[engine] ready`: the state says ready only after /health answered 200 (not at exec),
    with the memory limit in force meanwhile; SIGTERM stops the engine (143), the group goes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    loaded = tmp_path / "loaded"
    policy = _policy(
        tmp_path,
        scratch_slice,
        f'[memory]\nmax = "128M"\n[engine]\nready = "http://127.0.0.1:{port}/health"\n'
        'ready_timeout = "120s"\n',
        name="rdy",
    )
    run_dir = tmp_path / "run"
    engine = [sys.executable, "-c", _HEALTH, str(port), str(loaded)]
    p = subprocess.Popen(
        _governor("launch", "--policy", str(policy), "--", *engine),
        cwd=REPO,
        env={**os.environ, "GOVERNOR_RUN_DIR": str(run_dir)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    group = scratch_slice.path / "rdy"
    state = run_dir / "rdy" / "state.json"
    try:
        published = cgroups.wait_for(
            lambda: json.loads(state.read_text()) if state.exists() else None, 60, "the state"
        )
        assert published.get("ready") is not True  # exec'd, /health still 503
        assert cgroups.read(group / "memory.max") == str(128 << 20)
        loaded.touch()
        cgroups.wait_for(
            lambda: json.loads(state.read_text()).get("ready") is True, 60, "ready in the state"
        )
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 143
    finally:
        if p.poll() is None:
            p.kill()
        _, err = p.communicate(timeout=60)
    assert '"event": "engine.ready"' in err
    assert not group.exists()
