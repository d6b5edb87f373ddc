"""The Grafana dashboard (examples/grafana/governor.json) against a real Prometheus: its
queries as Grafana would send them, and a Prometheus server on loopback (its own config and
storage) that scrapes given /metrics endpoints. Used by the host tier
(tests/runtime/test_dashboard_live.py) and the kernel guest (tests/kernel/test_dashboard_guest.py)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "examples" / "grafana" / "governor.json"
# Grafana's interval variables, made concrete for a 1 s scrape: a window that holds several
# samples once Prometheus has scraped a few times (Grafana's $__rate_interval is at least four
# scrape intervals)
WINDOW = "10s"
SCRAPE = "1s"
# the families a host without the memory (and cpu) controller, or a run without the event,
# cannot give: their queries are proven in the kernel guest (tests/kernel/test_dashboard_guest.py)
GUEST = {
    "governor_memory_bytes": "the memory controller's memory.current/stat/peak",
    "governor_memory_limit_bytes": "the memory controller's limits",
    "governor_memory_events_total": "the memory controller's memory.events",
    "governor_model_memory_bytes": "a router's model leaves, each with memory.current",
    "governor_cpu_throttled_seconds_total": "the cpu controller's cpu.stat throttled_usec",
    "governor_shed_total": "a shed (a series from its first step on)",
    "governor_model_unloads_total": "a router's unload (a series from the first one on)",
}


@dataclass(frozen=True)
class Query:
    panel: str
    ref: str
    expr: str

    @property
    def guest_only(self) -> bool:
        return any(re.search(rf"\b{name}\b", self.expr) for name in GUEST)

    def concrete(self, policy: str, window: str = WINDOW) -> str:
        """The PromQL Grafana sends: $policy as a multi-value regex, intervals as ``window``."""
        return (
            self.expr.replace("$__rate_interval", window)
            .replace("$__interval", window)
            .replace("$policy", policy)
        )


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def queries(dashboard: dict[str, Any] | None = None) -> list[Query]:
    """Every target of every panel (rows' nested panels included), in the dashboard's order."""
    dash = load() if dashboard is None else dashboard
    out = []
    for panel in _panels(dash["panels"]):
        for t in panel.get("targets", ()):
            out.append(Query(panel["title"], t["refId"], t["expr"]))
    return out


def _panels(panels: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", ()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


class Prometheus:
    """A Prometheus server scraping ``targets`` (host:port) every SCRAPE, its API on a free
    loopback port; stopped by ``stop()``."""

    def __init__(self, targets: Sequence[str], workdir: Path, scrape_s: int = 1) -> None:
        """``scrape_s`` is also each scrape's timeout (Prometheus caps it at the interval): a
        TCG guest on a loaded host can take over a second to answer /metrics, and a scrape
        that times out gives no series at all, so the guest scrapes every 5 s."""
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: scripts/setup --tests installs it"
        config = workdir / "prometheus.yml"
        listed = ", ".join(f"'{t}'" for t in targets)
        scrape = f"{scrape_s}s" if scrape_s != 1 else SCRAPE
        self.window = WINDOW if scrape_s == 1 else f"{6 * scrape_s}s"  # several samples
        config.write_text(
            f"global:\n  scrape_interval: {scrape}\n  scrape_timeout: {scrape}\n"
            f"  evaluation_interval: {scrape}\n"
            "scrape_configs:\n  - job_name: governor\n"
            f"    static_configs:\n      - targets: [{listed}]\n"
        )
        self.api = f"127.0.0.1:{free_port()}"
        self.log = workdir / "prometheus.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'tsdb'}",
                    f"--web.listen-address={self.api}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar as one row) of ``promql`` now; raises on an API error
        (a query Prometheus cannot parse is a 400)."""
        q = urllib.parse.urlencode({"query": promql})
        try:
            out = _get(f"http://{self.api}/api/v1/query?{q}")
        except urllib.error.HTTPError as err:
            if err.code in (400, 422):  # Prometheus refuses the query: no retry helps
                raise AssertionError(f"{promql}: {err.code} {err.read()[:500]!r}") from err
            raise  # 503 while the server starts (its storage not ready): an OSError, retried
        assert out["status"] == "success", out
        data = out["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's label_values(MATCH, LABEL) asks Prometheus for."""
        q = urllib.parse.urlencode({"match[]": match})
        out = _get(f"http://{self.api}/api/v1/label/{label}/values?{q}")
        values: list[str] = out["data"]
        return values

    def targets(self) -> list[str]:
        """Each scrape target's health and last error, for a failure's message."""
        try:
            out = _get(f"http://{self.api}/api/v1/targets")
        except OSError as err:
            return [f"targets unreadable: {err}"]
        return [
            f"{t.get('scrapeUrl')}: {t.get('health')} {t.get('lastError')!r}"
            f" ({t.get('lastScrapeDuration')} s)"
            for t in out.get("data", {}).get("activeTargets", [])
        ]

    def alive(self) -> None:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def empty_queries(
    prom: Prometheus, wanted: Sequence[Query], policy: str, timeout: float
) -> dict[str, str]:
    """Run every query of ``wanted`` until each has returned at least one series; what still
    returns none when ``timeout`` (a bound on a hung test, not a timing assertion) has passed:
    {"panel/ref": the concrete PromQL}. A query Prometheus refuses fails at once."""
    left = {f"{q.panel}/{q.ref}": q.concrete(policy, prom.window) for q in wanted}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        prom.alive()
        for key, promql in list(left.items()):
            with contextlib.suppress(OSError):
                if prom.query(promql):
                    del left[key]
        if left:
            time.sleep(1)
    return left
