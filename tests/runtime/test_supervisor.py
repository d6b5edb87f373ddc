"""The supervisor (governor/supervise/supervisor.py) through real launches: the engine's status is what
`governor launch` exits with, whatever else fails (a report that cannot be written); nothing
is left in the cgroup tree unless --keep says so; an engine that cannot be started leaves no
cgroup; --psi reaches the monitor (also on a cached plan); the prefetch helper runs in the
engine's leaf while the engine runs.

Needs what tests/runtime/conftest.py says (root, cgroup2, PSI); mlock as root for the helper.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from .conftest import RUN_TIMEOUT_S, Governor

PRESSURE_RULE = '[[pressure]]\nwhen = "memory some 150ms/2s"\ndo = ["log"]\n'


def _report(path: Path) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(path.read_text())
    return d


def test_the_engine_status_is_kept_when_the_report_cannot_be_written(
    governor: Governor, tmp_path: Path
) -> None:
    # the directory exists at the pre-apply check and is gone when the report is written
    directory = tmp_path / "goes-away"
    directory.mkdir()
    report = directory / "report.json"
    engine = ("/bin/sh", "-c", f"rmdir '{directory}'; exit 7")
    run = governor.run(governor.policy(), engine, "--report", str(report))
    assert run.code == 7, run.stderr
    failed = [e for e in run.events if e["event"] == "report.failed"]
    assert [(e["file"], e["level"]) for e in failed] == [(str(report), "error")]
    assert not report.exists()
    assert not governor.group.exists()


def test_a_report_path_that_cannot_be_written_is_refused_before_the_apply(
    governor: Governor, tmp_path: Path
) -> None:
    report = tmp_path / "no-such-dir" / "report.json"
    run = governor.run(governor.policy(), ("/bin/sh", "-c", "exit 7"), "--report", str(report))
    assert run.code == 66, run.stderr
    assert "does not exist" in run.stderr
    assert not governor.group.exists()


def test_a_written_report_has_the_engine_status_and_the_group_is_removed(
    governor: Governor, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    run = governor.run(governor.policy(), ("/bin/sh", "-c", "exit 3"), "--report", str(report))
    assert run.code == 3, run.stderr
    assert _report(report)["exit_code"] == 3
    assert not governor.group.exists()


def test_an_engine_killed_by_a_signal_exits_128_plus_the_signal(governor: Governor) -> None:
    run = governor.run(governor.policy(), ("/bin/sh", "-c", "kill -TERM $$"))
    assert run.code == 128 + signal.SIGTERM, run.stderr
    assert not governor.group.exists()


def test_an_engine_that_is_not_found_exits_127_and_creates_no_cgroup(governor: Governor) -> None:
    run = governor.run(governor.policy(), (str(governor.workdir / "no-such-engine"),))
    assert run.code == 127, run.stderr
    assert "governor: engine not found" in run.stderr
    assert not governor.group.exists()


def test_an_engine_that_fails_at_exec_after_the_apply_exits_126_and_leaves_no_cgroup(
    governor: Governor,
) -> None:
    engine = governor.workdir / "not-a-program"
    engine.write_bytes(b"\x7fELF\x00garbage")  # executable bit, no valid format: ENOEXEC
    engine.chmod(0o755)
    run = governor.run(governor.policy(), (str(engine),))
    assert run.code == 126, run.stderr
    assert run.has("cgroup.mkdir")  # it failed after the apply, so the cleanup was exercised
    assert not governor.group.exists()


def test_keep_leaves_the_group_recorded_like_apply_and_remove_keeps_the_operators_slice(
    governor: Governor,
) -> None:
    """--keep: the group outlives the run and is published as `governor apply`'s would be
    (status shows it; remove knows what the run created): the scratch slice, made before the
    run like an operator's, stays after remove."""
    import os
    import subprocess
    import sys

    policy = governor.policy()
    governor.slice.path.mkdir(exist_ok=True)  # the operator's, before any governor ran
    run = governor.run(policy, ("/bin/true",), "--keep")
    assert run.code == 0, run.stderr
    assert governor.group.is_dir() and governor.leaf.is_dir()
    state_file = Path(os.environ["GOVERNOR_RUN_DIR"]) / governor.group.name / "state.json"
    state = json.loads(state_file.read_text())
    assert (state["source"], state["pid"], state["kept_by"]) == ("apply", None, "launch --keep")
    slice_ = governor.slice.name
    assert sorted(state["created"]) == [
        f"{slice_}/{governor.group.name}",
        f"{slice_}/{governor.group.name}/{governor.leaf.name}",
    ]
    shown = subprocess.run(
        [sys.executable, "-m", "governor", "status", governor.group.name, "--json"],
        capture_output=True, text=True, env=governor.env(), check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)[0]["state"] == "running"
    removed = subprocess.run(
        [sys.executable, "-m", "governor", "--cgroup-root", str(governor.cgroup_root),
         "remove", str(policy)],
        capture_output=True, text=True, env=governor.env(), check=False,
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    assert not governor.group.exists() and governor.slice.path.is_dir()
    assert not state_file.exists()


def test_a_running_launch_publishes_its_start_time_and_whether_it_keeps_its_group(
    governor: Governor,
) -> None:
    """Issue 43: the state names its supervisor by pid AND start time (a reused pid is not
    it), and a --keep launch says so while it runs (its claim stays after its engine stops:
    an admission's shed never counts it)."""
    import os
    import time

    from governor.kernel.procfs import ProcFs

    state_file = Path(os.environ["GOVERNOR_RUN_DIR"]) / governor.group.name / "state.json"
    for options, kept in (((), None), (("--keep",), "launch --keep")):
        gov = governor.start(governor.policy(), ("/bin/sleep", "60"), *options)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not state_file.exists():
                assert gov.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            state = json.loads(state_file.read_text())
            assert (state["source"], state["pid"]) == ("launch", gov.pid)
            assert state["pid_start"] == ProcFs().starttime(gov.pid)
            assert state.get("kept_by") == kept
        finally:
            gov.send_signal(signal.SIGTERM)
            gov.communicate(timeout=RUN_TIMEOUT_S)
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-m", "governor", "--cgroup-root", str(governor.cgroup_root),
         "remove", str(governor.policy())],
        env=governor.env(), capture_output=True, check=False,
    )  # fmt: skip


def _psi_modes(report: Path) -> list[str]:
    return [p["mode"] for p in _report(report)["extra"]["monitor"]["psi"]]


def test_psi_rules_use_triggers_by_default_and_polling_with_psi_poll_even_on_a_cached_plan(
    governor: Governor, tmp_path: Path
) -> None:
    policy = governor.policy(PRESSURE_RULE)
    default, polled = tmp_path / "default.json", tmp_path / "polled.json"
    first = governor.run(policy, ("/bin/true",), "--report", str(default))
    assert first.code == 0, first.stderr
    assert _psi_modes(default) == ["trigger"]
    second = governor.run(policy, ("/bin/true",), "--psi", "poll", "--report", str(polled))
    assert second.code == 0, second.stderr
    assert second.has("plan_cache.hit")  # --psi is a run-time option, not part of the plan
    assert _psi_modes(polled) == ["polled"]


# an engine that waits (at most 10 s) until another process shares its leaf, then lists the
# leaf; it counts and lists with shell builtins only, so no child of its own is in the list
_ENGINE = """#!/bin/sh
procs="{root}$(sed -n 's/^0:://p' /proc/self/cgroup)/cgroup.procs"
i=0
while [ $i -lt 500 ]; do
    n=0
    while read -r pid; do n=$((n + 1)); done < "$procs"
    [ $n -ge 2 ] && break
    sleep 0.02
    i=$((i + 1))
done
echo $$ > "{out}.engine"
while read -r pid; do echo "$pid"; done < "$procs" > "{out}"
# then wait (bounded) until another process in the leaf holds a lock: the helper has locked
# and published its result, so the report can carry it (the engine exiting earlier is fine
# for the governor, which then stops the helper, but this test is about the result)
i=0
while [ $i -lt 500 ]; do
    for pid in $(cat "$procs"); do
        [ "$pid" = $$ ] && continue
        lck=$(sed -n 's/^VmLck:[[:space:]]*\\([0-9]*\\).*/\1/p' /proc/$pid/status 2>/dev/null)
        [ "${{lck:-0}}" -gt 0 ] && exit 0
    done
    sleep 0.02
    i=$((i + 1))
done
"""


def test_the_prefetch_helper_runs_in_the_engines_leaf_while_the_engine_runs(
    governor: Governor, tmp_path: Path
) -> None:
    model = governor.workdir / "model.bin"
    model.write_bytes(b"\x01" * (1 << 20))
    seen = tmp_path / "leaf-procs"
    engine = governor.workdir / "engine.sh"
    engine.write_text(_ENGINE.format(root=governor.cgroup_root, out=seen))
    engine.chmod(0o755)
    # lock: the helper holds the mapping until the engine exits, so the engine can see it
    policy = governor.policy('[engine]\nkind = "llama.cpp"\n\n[prefetch]\nmode = "lock"\n')
    report = tmp_path / "report.json"
    run = governor.run(
        policy, (str(engine), "-m", str(model), "-c", "512"), "--report", str(report)
    )
    assert run.code == 0, run.stderr
    engine_pid = int(Path(f"{seen}.engine").read_text())
    (helper,) = [e["pid"] for e in run.events if e["event"] == "prefetch.started"]
    assert sorted(int(p) for p in seen.read_text().split()) == sorted([engine_pid, helper])
    assert _report(report)["prefetch_bytes"] == 1 << 20
    assert not governor.group.exists()


# a stand-in server: /health answers 503 until the file `loaded` exists, then 200 (as
# llama-server while it loads its model); it records the first 200 it gave
_SERVER = r"""
import http.server, os, sys, time
port, work = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = os.path.exists(os.path.join(work, "loaded"))
        if ok and not os.path.exists(os.path.join(work, "first200")):
            open(os.path.join(work, "first200"), "w").write(str(time.time()))
        self.send_response(200 if ok else 503); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ready_is_sent_when_the_ready_url_answers_200_not_at_exec(
    governor: Governor, tmp_path: Path
) -> None:
    import os
    import socket
    import sys

    port = _free_port()
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(60)
    policy = governor.policy(f'[engine]\nready = "http://127.0.0.1:{port}/health"\n')
    os.environ["NOTIFY_SOCKET"] = str(sock_path)  # Governor.env copies os.environ
    try:
        p = governor.start(policy, (sys.executable, "-c", _SERVER, str(port), str(tmp_path)))
    finally:
        del os.environ["NOTIFY_SOCKET"]
    try:
        first = sock.recv(4096).decode()
        assert first.startswith("STATUS=") and "READY=1" not in first  # loading: not ready
        assert f"waiting for http://127.0.0.1:{port}/health" in first
        (tmp_path / "loaded").touch()  # the model is loaded: /health says 200 from now on
        ready_msg = sock.recv(4096).decode()
        assert ready_msg.startswith("READY=1\n"), ready_msg
        assert (tmp_path / "first200").exists()  # READY=1 came after a 200, not before
    finally:
        p.terminate()
        _out, err = p.communicate(timeout=60)
        sock.close()
    assert '"event": "engine.ready"' in err
    assert not governor.group.exists()


def test_an_engine_that_never_answers_its_ready_url_is_stopped_and_launch_exits_69(
    governor: Governor,
) -> None:
    port = _free_port()  # nothing listens there
    policy = governor.policy(
        f'[engine]\nready = "http://127.0.0.1:{port}/health"\nready_timeout = "1s"\n'
    )
    run = governor.run(policy, ("sleep", "60"))
    assert run.code == 69, run.stderr
    assert f"engine not ready: http://127.0.0.1:{port}/health did not answer within 1s" in (
        run.stderr
    )
    assert "(engine.ready_timeout)" in run.stderr and "hint:" in run.stderr
    assert not governor.group.exists()


def test_a_never_ready_engine_that_ignores_sigterm_is_killed_after_the_grace(
    governor: Governor,
) -> None:
    """SIGTERM is not enough for an engine that ignores it: SIGKILL follows after the grace
    (supervise/ready.py STOP_GRACE_S), launch still exits 69 and nothing is left."""
    import sys

    port = _free_port()  # nothing listens there
    policy = governor.policy(
        f'[engine]\nready = "http://127.0.0.1:{port}/health"\nready_timeout = "1s"\n'
    )
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    run = governor.run(policy, (sys.executable, "-c", stubborn))
    assert run.code == 69, run.stderr
    assert "it was stopped (SIGTERM, SIGKILL after 10s), exit 137" in run.stderr, run.stderr
    assert not governor.group.exists()
