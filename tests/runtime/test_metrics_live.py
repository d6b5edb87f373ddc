"""Metrics with the real components (issue 13), on the host's cgroup2 mount: a running
`governor launch --metrics` scraped by a Prometheus server that the test starts on loopback
(its own config and storage), queried through its HTTP API; `governor metrics --textfile`
served by prometheus-node-exporter's textfile collector; `promtool check metrics` on what the
supervisor serves; a busy port refused before anything is applied.

Needs what tests/runtime/conftest.py says, and Debian's prometheus and
prometheus-node-exporter (scripts/setup --tests installs them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Governor

T = TypeVar("T")
EXAMPLE_RULES = (
    Path(__file__).resolve().parents[2] / "examples" / "prometheus" / "governor.rules.yml"
)
WAIT_S = 90  # generous: the host is shared and a TCG guest may be running beside the tests


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: scripts/setup --tests installs prometheus and node-exporter"
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, probe: Callable[[], T | None], proc: subprocess.Popen[Any] | None) -> T:
    """Poll ``probe`` until it returns something; fail with ``what`` (and the process's
    stderr if it died) otherwise. Not a timing assertion: the bound only ends a hung test."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            _out, err = proc.communicate()
            pytest.fail(f"{what}: the process exited {proc.returncode}: {err}")
        with contextlib.suppress(OSError, ValueError):
            got = probe()
            if got is not None:
                return got
        time.sleep(0.3)
    pytest.fail(f"{what}: not within {WAIT_S} s")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return bytes(resp.read())


def _series(text: bytes, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return float(s.value)
    return None


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


def _launch(
    governor: Governor, run_dir: Path, *options: str, engine: tuple[str, ...] = ("sleep", "300")
) -> subprocess.Popen[str]:
    env = governor.env() | {"GOVERNOR_RUN_DIR": str(run_dir)}
    env.pop("GOVERNOR_METRICS", None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "governor",
            *governor.args(governor.policy(RULES), engine, *options),
        ],
        cwd=governor.workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


RULES = """[[pressure]]
when = "memory some 150ms/2s"
do = ["log"]
"""


@pytest.fixture
def served(governor: Governor, run_dir: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A launch with an engine that waits, serving /metrics on a loopback port."""
    port = _free_port()
    proc = _launch(governor, run_dir, "--metrics", f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        _wait(
            "the supervisor serves its slice",
            lambda: _series(_get(url), "governor_engine_up", policy="rt") == 1 or None,
            proc,
        )
        yield proc, url
    finally:
        _stop(proc)


def test_prometheus_scrapes_a_running_launch_and_promql_returns_the_policys_series(
    served: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    proc, url = served
    body = _get(url)
    check = subprocess.run(
        [_tool("promtool"), "check", "metrics"],
        input=body,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    assert _series(body, "governor_pressure_memory_waiting_seconds_total", policy="rt") is not None
    assert _series(body, "governor_rule_firings_total", policy="rt", rule="0") == 0

    target = urllib.parse.urlsplit(url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {EXAMPLE_RULES}\n"
        "scrape_configs:\n  - job_name: governor\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    api = f"127.0.0.1:{_free_port()}"
    prom = subprocess.Popen(
        [
            _tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={api}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def query() -> list[dict[str, Any]] | None:
            q = urllib.parse.urlencode({"query": 'governor_engine_up{policy="rt"}'})
            out = json.loads(_get(f"http://{api}/api/v1/query?{q}"))
            return out["data"]["result"] or None

        (result,) = _wait("Prometheus has scraped the governor", query, prom)
        assert result["metric"]["job"] == "governor"
        assert result["metric"]["policy"] == "rt"
        assert result["value"][1] == "1"
        assert proc.poll() is None

        # the example alerting rules evaluate on the live series without error
        def rules() -> list[dict[str, Any]] | None:
            out = json.loads(_get(f"http://{api}/api/v1/rules"))
            found = [r for g in out["data"]["groups"] for r in g["rules"]]
            evaluated = all(r.get("lastEvaluation", "0001").startswith("20") for r in found)
            return found if found and evaluated else None

        found = _wait("Prometheus evaluated the example rules", rules, prom)
        assert {r["name"] for r in found} >= {"GovernorEngineDown", "GovernorMemoryNearMax"}
        assert [r["name"] for r in found if r["health"] != "ok"] == []
        down = next(r for r in found if r["name"] == "GovernorEngineDown")
        assert down["alerts"] == []  # the engine runs
    finally:
        _stop(prom)


def test_the_endpoint_goes_away_with_the_supervisor(
    served: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = served
    _stop(proc)
    assert proc.returncode == 128 + signal.SIGTERM  # the engine's status: it got the SIGTERM
    with pytest.raises(OSError):
        _get(url)


def test_node_exporter_serves_the_textfile_of_a_running_launch(
    served: tuple[subprocess.Popen[str], str], run_dir: Path, tmp_path: Path
) -> None:
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    env = dict(os.environ) | {"GOVERNOR_RUN_DIR": str(run_dir)}
    wrote = subprocess.run(
        [sys.executable, "-m", "governor", "metrics", "--textfile", str(textfiles)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert wrote.returncode == 0, wrote.stderr
    assert sorted(p.name for p in textfiles.iterdir()) == ["governor.prom"]
    listen = f"127.0.0.1:{_free_port()}"
    exporter = subprocess.Popen(
        [
            _tool("prometheus-node-exporter"),
            f"--web.listen-address={listen}",
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={textfiles}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = _wait(
            "node_exporter serves /metrics", lambda: _get(f"http://{listen}/metrics"), exporter
        )
        assert _series(body, "governor_engine_up", policy="rt") == 1
        assert (
            _series(body, "governor_pressure_memory_waiting_seconds_total", policy="rt") is not None
        )
        assert _series(body, "node_textfile_scrape_error") == 0
    finally:
        _stop(exporter)


def test_a_busy_metrics_port_is_69_before_anything_is_applied(
    governor: Governor, run_dir: Path
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _launch(governor, run_dir, "--metrics", f"127.0.0.1:{port}", engine=("true",))
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 69, err
    lines = [ln for ln in err.splitlines() if ln.startswith(("governor:", "hint:"))]
    assert lines[0].startswith("governor: cannot listen for metrics: Address already in use")
    assert lines[1].startswith("hint: ")
    assert not governor.group.exists()


def test_a_bad_metrics_address_is_a_usage_error(governor: Governor, run_dir: Path) -> None:
    proc = _launch(governor, run_dir, "--metrics", "127.0.0.1:99999", engine=("true",))
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "governor: bad --metrics value: not a TCP port: '99999' (--metrics)" in err
    assert not governor.group.exists()
