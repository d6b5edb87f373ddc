"""The Grafana dashboard's queries (examples/grafana/governor.json) against the real Prometheus,
scraping a running `governor launch --metrics` on the host's cgroup2 mount: each query, as
Grafana sends it ($policy the launch's, the interval variables a concrete window), returns at
least one series. The families this host cannot give (no memory or cpu controller here; a shed,
an unload) are the kernel guest's: tests/kernel/test_dashboard_guest.py runs every query there.

Needs what tests/runtime/conftest.py says, and Debian's prometheus (scripts/setup --tests)."""

from __future__ import annotations

from pathlib import Path

from helpers import dashboard

from .conftest import Governor
from .test_metrics_live import WAIT_S, _get, _launch, _series, _stop, _wait


def test_every_dashboard_query_the_host_can_give_returns_series_from_a_live_launch(
    governor: Governor, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    port = dashboard.free_port()
    gov = _launch(governor, run, "--metrics", f"127.0.0.1:{port}")
    prom = None
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        _wait(
            "the supervisor serves its slice",
            lambda: _series(_get(url), "governor_engine_up", policy="rt") == 1 or None,
            gov,
        )
        prom = dashboard.Prometheus([f"127.0.0.1:{port}"], tmp_path)
        found = dashboard.queries()
        host = [q for q in found if not q.guest_only]
        assert len(host) >= len(found) // 2, [q.expr for q in host]  # most run here
        left = dashboard.empty_queries(prom, host, "(rt)", timeout=WAIT_S)
        assert left == {}, (left, prom.targets(), prom.log.read_text()[-2000:])
        # the $policy variable's own query (Grafana's label_values(governor_engine_up, policy))
        assert prom.label_values("policy", "governor_engine_up") == ["rt"]
        assert gov.poll() is None
    finally:
        if prom is not None:
            prom.stop()
        _stop(gov)
