"""`governor monitor POLICY`: attach to a running slice (here: a fake tree, where the monitor
polls), or refuse with exit 69 when there is nothing to attach to. Needs: a tmp directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import run as _run

from .fakekernel import FakeKernelCgroupFs

REPO = Path(__file__).resolve().parents[2]
HOST = str(REPO / "tests" / "fixtures" / "hosts" / "cgroup2-full")
POLICY = """\
name = "chat"
[[pressure]]
when = "memory some 150ms/2s"
do = ["log"]
[[pressure]]
when = "oom_kill"
do = ["log"]
"""


def test_monitor_refuses_a_slice_that_is_not_running(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cgroup_root: Path
) -> None:
    policy = tmp_path / "chat.toml"
    policy.write_text(POLICY)
    code, _, err = _run(
        capsys, "--root", HOST, "--cgroup-root", str(cgroup_root), "monitor", str(policy)
    )
    assert code == 69, err
    assert "nothing to monitor" in err and "Traceback" not in err


def test_monitor_attaches_reports_and_stops_after_its_duration(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    cgroup_root: Path,
    fake_fs: FakeKernelCgroupFs,
) -> None:
    policy = tmp_path / "chat.toml"
    policy.write_text(POLICY)
    for cg in ("governor.slice", "governor.slice/chat"):
        fake_fs.mkdir(cg)
    report = tmp_path / "m.json"
    code, out, err = _run(
        capsys, "--root", HOST, "--cgroup-root", str(cgroup_root),
        "monitor", str(policy), "--duration", "0.3", "--sample-interval", "0.1",
        "--report", str(report),
    )  # fmt: skip
    assert code == 0, err
    assert "0 rule firing(s), 0 oom_kill seen" in out
    data = json.loads(report.read_text())
    assert [r["when"] for r in data["rules"]] == ["memory some 150ms/2s", "oom_kill"]
    assert data["psi"][0]["mode"] == "polled"
    assert data["sampler"]["samples"] >= 2


def test_monitor_serves_its_rules_and_the_slice_on_metrics_while_it_runs(
    tmp_path: Path, cgroup_root: Path, fake_fs: FakeKernelCgroupFs
) -> None:
    """The monitor runs in this (main) thread; a scraper thread reads /metrics until it has the
    policy's series, then SIGTERMs this process (the monitor's handler stops it)."""
    import os
    import signal
    import socket
    import threading
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from governor.api import attach as api_attach
    from governor.api import host as api_host

    policy = tmp_path / "chat.toml"
    policy.write_text(POLICY)
    for cg in ("governor.slice", "governor.slice/chat"):
        fake_fs.mkdir(cg)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    samples: dict[tuple[str, str], float] = {}
    returned = threading.Event()  # the monitor is gone: no SIGTERM for pytest itself

    def scrape() -> None:
        deadline = time.monotonic() + 60
        while not samples and not returned.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                continue
            for fam in text_string_to_metric_families(text):
                for smp in fam.samples:
                    if smp.labels.get("policy") == "chat":
                        samples[(smp.name, smp.labels.get("rule", ""))] = smp.value
        if not returned.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        out = api_attach.monitor(
            policy,
            api_host.HostOptions(root=Path(HOST), cgroup_root=cgroup_root),
            api_attach.MonitorOptions(sample_s=0.1, duration_s=90, metrics=("127.0.0.1", port)),
        )
    finally:
        returned.set()
        scraper.join(timeout=90)
    assert [r["fired"] for r in out["rules"]] == [0, 0]
    assert samples[("governor_rule_firings_total", "0")] == 0
    assert samples[("governor_rule_firings_total", "1")] == 0
    assert ("governor_engine_up", "") in samples
    with pytest.raises(OSError):  # the endpoint closed with the monitor
        urllib.request.urlopen(url, timeout=5)


def _plan_dict(policy: Path, cgroup_root: Path) -> dict[str, object]:
    from governor.api import host as api_host

    return api_host.check(
        policy, api_host.HostOptions(root=Path(HOST), cgroup_root=cgroup_root)
    ).to_dict()


def test_monitor_publishes_its_state_for_status_and_gives_apply_its_state_back(
    tmp_path: Path, cgroup_root: Path, fake_fs: FakeKernelCgroupFs
) -> None:
    """While it runs, `governor status` sees the monitor (its pid, its rules); apply's record
    of what it created rides along (remove needs it) and is the state again afterwards."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from governor.rundir.state import Publisher, run_dir

    policy = tmp_path / "chat.toml"
    policy.write_text(POLICY)
    for cg in ("governor.slice", "governor.slice/chat"):
        fake_fs.mkdir(cg)
    applied = {
        "policy": "chat",
        "source": "apply",
        "pid": None,
        "created": ["governor.slice", "governor.slice/chat"],
        "plan": _plan_dict(policy, cgroup_root),
    }
    publisher = Publisher(run_dir(), "chat")
    assert publisher.publish(applied)
    gov = [sys.executable, "-m", "governor", "--root", HOST, "--cgroup-root", str(cgroup_root)]
    mon = subprocess.Popen(
        [*gov, "monitor", str(policy), "--sample-interval", "0.1"],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while getattr(publisher.read(), "source", None) != "monitor":
            assert mon.poll() is None and time.monotonic() < deadline, mon.stderr
            time.sleep(0.05)
        state = publisher.read()
        shown = subprocess.run(
            [*gov, "status", "chat", "--json"],
            check=False, cwd=REPO, capture_output=True, text=True,
        )  # fmt: skip
    finally:
        mon.send_signal(signal.SIGTERM)
        _, err = mon.communicate(timeout=60)
    assert mon.returncode == 0, err
    assert state is not None and state.pid == mon.pid, state
    assert state.created == applied["created"]
    assert shown.returncode == 0, shown.stderr
    (item,) = json.loads(shown.stdout)
    assert (item["source"], item["state"], item["pid"]) == ("monitor", "running", mon.pid)
    assert [r["when"] for r in item["rules"]] == ["memory some 150ms/2s", "oom_kill"]
    after = publisher.read()
    assert after is not None and after.source == "apply", after
    assert after.created == applied["created"]
    assert os.path.exists(publisher.path)


def test_monitor_refuses_a_name_a_live_supervisor_governs_and_replaces_a_stale_one(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    cgroup_root: Path,
    fake_fs: FakeKernelCgroupFs,
) -> None:
    import subprocess
    import sys
    import time

    from governor.rundir.state import Publisher, run_dir

    policy = tmp_path / "chat.toml"
    policy.write_text(POLICY)
    for cg in ("governor.slice", "governor.slice/chat"):
        fake_fs.mkdir(cg)
    publisher = Publisher(run_dir(), "chat")
    # a running `governor launch` of the same name (what alive() recognises: a governor)
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "governor", "launch"]
    )
    try:
        for _ in range(500):  # its command line shows once its exec has finished
            if b"governor" in Path(f"/proc/{other.pid}/cmdline").read_bytes():
                break
            time.sleep(0.01)
        launched = {"policy": "chat", "source": "launch", "pid": other.pid}
        publisher.publish(launched)
        argv = ("--root", HOST, "--cgroup-root", str(cgroup_root), "monitor", str(policy))
        code, _, err = _run(capsys, *argv, "--duration", "0.3", "--sample-interval", "0.1")
        assert code == 69, err
        assert f"governed already by governor pid {other.pid}" in err, err
        assert json.loads(publisher.path.read_bytes()) == {"format": 1, **launched}  # untouched
    finally:
        other.kill()
        other.wait()
    # its supervisor gone: a stale state, which the monitor replaces and removes at its end
    code, _, err = _run(capsys, *argv, "--duration", "0.3", "--sample-interval", "0.1")
    assert code == 0, err
    assert publisher.read() is None


def test_a_monitor_leaves_a_state_it_does_not_own_when_it_ends(
    tmp_path: Path, cgroup_root: Path, fake_fs: FakeKernelCgroupFs
) -> None:
    """A launch of the same name that started while the monitor ran published its own state:
    the monitor's end must not remove (or overwrite) it."""
    import threading
    import time

    from governor.api import attach as api_attach
    from governor.api import host as api_host
    from governor.rundir.state import Publisher, run_dir

    policy = tmp_path / "chat.toml"
    policy.write_text(POLICY)
    for cg in ("governor.slice", "governor.slice/chat"):
        fake_fs.mkdir(cg)
    publisher = Publisher(run_dir(), "chat")
    theirs = {"policy": "chat", "source": "launch", "pid": 2**22 + 11}

    def replace_state() -> None:
        deadline = time.monotonic() + 30
        while getattr(publisher.read(), "source", None) != "monitor":
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        publisher.publish(theirs)

    other = threading.Thread(target=replace_state)
    other.start()
    api_attach.monitor(
        policy,
        api_host.HostOptions(root=Path(HOST), cgroup_root=cgroup_root),
        api_attach.MonitorOptions(sample_s=0.1, duration_s=1.5),
    )
    other.join(timeout=30)
    assert json.loads(publisher.path.read_bytes()) == {"format": 1, **theirs}
