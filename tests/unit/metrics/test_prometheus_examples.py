"""examples/prometheus/: the scrape config and the alerting rules pass Prometheus' own checks
(`promtool check config`, `promtool check rules`), each alert fires on a synthetic series in
`promtool test rules`, and every governor_* name they query is one the collector exports.
Needs Debian's prometheus package (scripts/setup --tests installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from governor.metrics.export import exposition

from .test_metrics import _publish, _slice

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "prometheus"


def _promtool(*args: str, cwd: Path = EXAMPLES) -> str:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup --tests installs the prometheus package"
    out = subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("check", "config", "prometheus.yml"),
        ("check", "rules", "governor.rules.yml"),
        ("test", "rules", "governor.rules.test.yml"),
    ],
    ids=["check-config", "check-rules", "test-rules"],
)
def test_promtool_accepts_the_examples(args: tuple[str, ...]) -> None:
    assert "SUCCESS" in _promtool(*args)


def test_every_alert_the_issue_asks_for_is_there_and_tested() -> None:
    rules = (EXAMPLES / "governor.rules.yml").read_text()
    tests = (EXAMPLES / "governor.rules.test.yml").read_text()
    alerts = re.findall(r"alert: (\w+)", rules)
    for alert in (
        "GovernorEngineDown",
        "GovernorOOMKill",
        "GovernorMemoryFullPressure",
        "GovernorMemoryNearMax",
        "GovernorPolicyDrift",
    ):
        assert alert in alerts
        assert f"alertname: {alert}" in tests


def test_the_rules_query_names_the_collector_exports(tmp_path: Path) -> None:
    plan, _group, run = _slice(tmp_path)
    _publish(run, plan)
    exported = set(re.findall(rb"^(governor_\w+)", exposition(run), re.M))
    queried = set(re.findall(r"\b(governor_\w+)", (EXAMPLES / "governor.rules.yml").read_text()))
    assert queried and {q.encode() for q in queried} <= exported
