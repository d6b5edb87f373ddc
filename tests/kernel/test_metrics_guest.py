"""Metrics on a real cgroup v2 kernel with the memory controller (kernel tier): a launch with
`--metrics` serves the slice's real memory values and limits. The engine touches 48 MiB and
holds it; governor_memory_bytes{kind="current"} lies between two reads of the group's
memory.current taken around the scrape, the limits are the policy's, pids.max too, and the
node_exporter textfile (`governor metrics --textfile`) says the same."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice
from prometheus_client.parser import text_string_to_metric_families

ALL = ("memory", "cpu", "cpuset", "io", "pids")
REPO = Path(__file__).resolve().parents[2]
HOG = REPO / "tests" / "helpers" / "hog.py"


def _samples(text: str) -> dict[tuple[str, str], float]:
    """(name, the kind/limit/event label or "") -> value, for policy "mx"."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("policy") == "mx":
                sub = s.labels.get("kind") or s.labels.get("limit") or s.labels.get("event") or ""
                out[(s.name, sub)] = float(s.value)
    return out


@pytest.mark.kernel(controllers=ALL, root=True)
def test_served_metrics_are_the_kernels_memory_values_and_the_policys_limits(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    env.pop("GOVERNOR_METRICS", None)
    policy = tmp_path / "mx.toml"
    policy.write_text(
        f'name = "mx"\nslice = "{scratch_slice.name}"\n'
        + textwrap.dedent(
            """
            [memory]
            low = "16M"
            high = "200M"
            max = "300M"
            [pids]
            max = 64
            """
        )
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = [sys.executable, str(HOG), "--mib", "48"]
    gov = subprocess.Popen(
        [sys.executable, "-m", "governor", "launch", "--policy", str(policy),
         "--metrics", f"127.0.0.1:{port}", "--", *engine],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    group = scratch_slice.path / "mx"

    def current() -> int:
        return int((group / "memory.current").read_text())

    def grown() -> bool:
        if gov.poll() is not None:  # the launch ended: say why instead of a missing file
            _out, err = gov.communicate()
            raise AssertionError(f"governor exited {gov.returncode}: {err[-3000:]}")
        try:
            return current() > 48 << 20
        except FileNotFoundError:  # not there yet
            return False

    try:
        # a CI run saw the group's directory, then no memory.current in it: the launch had
        # ended (its stderr was never shown); grown() says so now
        cgroups.wait_for(grown, timeout=240, what="the hog's 48 MiB")
        before = current()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
            served = _samples(resp.read().decode())
        after = current()
        scraped = served[("governor_memory_bytes", "current")]
        assert min(before, after) - (1 << 20) <= scraped <= max(before, after) + (1 << 20)
        assert served[("governor_memory_bytes", "anon")] >= 48 << 20
        assert served[("governor_memory_bytes", "peak")] >= scraped
        assert served[("governor_memory_limit_bytes", "max")] == 300 << 20
        assert served[("governor_memory_limit_bytes", "high")] == 200 << 20
        assert served[("governor_memory_limit_bytes", "low")] == 16 << 20
        assert served[("governor_memory_limit_bytes", "max")] == int(
            (group / "memory.max").read_text()
        )
        assert served[("governor_pids_max", "")] == 64
        assert served[("governor_pids_current", "")] >= 1
        assert served[("governor_engine_up", "")] == 1
        assert served[("governor_policy_drift", "")] == 0
        assert served[("governor_memory_events_total", "oom_kill")] == 0

        textfiles = tmp_path / "textfile"
        textfiles.mkdir()
        wrote = subprocess.run(
            [sys.executable, "-m", "governor", "metrics", "--textfile", str(textfiles)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        text = _samples((textfiles / "governor.prom").read_text())
        assert text[("governor_memory_limit_bytes", "max")] == 300 << 20
        assert abs(text[("governor_memory_bytes", "current")] - current()) <= 1 << 20
    finally:
        gov.terminate()
        try:
            gov.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            gov.kill()
            gov.communicate()
    assert not group.exists()
