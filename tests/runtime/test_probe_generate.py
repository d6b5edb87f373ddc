"""[engine] probe_generate through a real `governor launch` (issue 46 item 5): a stand-in server
whose /health is green from the start and whose completion hangs is ready (READY=1 at its first
200), then found unresponsive by the one-token probe, relaunched once within restart_max, and
at the second time stopped: launch exits 69 naming the probe.

Needs what tests/runtime/conftest.py says (root, cgroup2, PSI)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .conftest import Governor
from .test_supervisor import _free_port

# /health: 200 at once; POST /v1/completions: never answered (a stuck load path or slot)
_STUCK = r"""
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def do_POST(self):
        time.sleep(3600)
    def log_message(self, *a): pass
class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_green_health_with_a_stuck_generation_is_relaunched_then_fails_69(
    governor: Governor, tmp_path: Path
) -> None:
    port = _free_port()
    report = tmp_path / "report.json"
    policy = governor.policy(
        f'[engine]\nready = "http://127.0.0.1:{port}/health"\nprobe_generate = "1s"\n'
        '[process]\nrestart_max = 1\nrestart_backoff = "100ms"\n'
    )
    run = governor.run(policy, (sys.executable, "-c", _STUCK, str(port)), "--report", str(report))
    assert run.code == 69, run.stderr
    url = f"http://127.0.0.1:{port}/v1/completions"
    assert f"engine unresponsive: {url} gave no token within 1s 3 times in a row" in run.stderr
    assert "(engine.probe_generate)" in run.stderr  # not engine.ready's wording and hint
    assert "engine.ready_timeout" not in run.stderr and "process.restart_max" in run.stderr
    assert "restart limit 1 reached" in run.stderr and "hint:" in run.stderr
    assert run.event_names().count("engine.ready") == 2  # /health was green both times
    gone = [e for e in run.events if e["event"] == "engine.unresponsive"]
    assert [e["relaunch"] for e in gone] == [True, False]
    restarts = json.loads(report.read_text())["extra"]["restarts"]
    assert [r["when"] for r in restarts] == ["probe_generate"]
    assert not governor.group.exists()
