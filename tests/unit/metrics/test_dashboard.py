"""examples/grafana/governor.json: a Grafana 10/11 dashboard model whose every query names only
series the collector exports, with labels and label values it exports. The exposition it is
checked against is the collector's own, from a fake slice whose published state has every
optional family the dashboard draws (sheds, a router's model leaves and unloads). That the
queries return series from a live launch is tests/runtime/test_dashboard_live.py and
tests/kernel/test_dashboard_guest.py."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import dashboard
from prometheus_client.parser import text_string_to_metric_families

from governor.metrics.export import exposition

from .test_metrics import _publish, _slice

DS = {"type": "prometheus", "uid": "${datasource}"}
SCRAPE_LABELS = {"job", "instance"}  # what Prometheus adds to every scraped series
# PromQL words that are not metric names (functions are followed by "(", so are not listed;
# an aggregation may be followed by its by/without clause)
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan", "sum", "min", "max", "avg", "group", "stddev", "stdvar",
    "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip
SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
SHED_STEPS = ("unload", "throttle", "freeze", "stop", "kill", "thaw", "raise", "release")


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, its {matchers} or "") of every vector selector of a PromQL expression:
    identifiers that are not a function call, a keyword, a label list of by/on/... or inside
    a range [..] or a string."""
    text = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges and subqueries
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1 ", text
    )  # label lists
    out = []
    pos = 0
    while m := SELECTOR.search(text, pos):
        pos = m.end()
        name, braces = m.group(1), m.group(2) or ""
        if name.lower() in KEYWORDS or text[m.end(1) :].lstrip().startswith("("):
            continue
        out.append((name, braces))
    # a selector written as {__name__=...} alone, or a string literal, would hide a name
    assert not re.search(r'(^|[^\w])\{|"', re.sub(SELECTOR, " ", text)), expr
    return out


def matchers(braces: str) -> list[tuple[str, str, str]]:
    """(label, operator, value) of a selector's {...}; the whole of it must parse."""
    inner = braces[1:-1] if braces else ""
    found = list(MATCHER.finditer(inner))
    assert "".join(m.group(0) for m in found).strip() == inner.strip(), braces
    return [(m.group(1), m.group(2), m.group(3)) for m in found]


def _exported(tmp_path: Path) -> dict[str, dict[str, set[str]]]:
    """name -> label -> the values the collector exports, for a slice with every family the
    dashboard draws."""
    plan, group, run = _slice(tmp_path)
    for alias in ("tiny", "kv"):
        leaf = group / "models" / alias
        leaf.mkdir(parents=True)
        (leaf / "memory.current").write_text("4096\n")
        (leaf / "cgroup.procs").write_text("")
    _publish(
        run,
        plan,
        model={"model": "/models/qwen-q4.gguf", "quant": "Q4_0", "total": 1234567},
        shed_totals=[{"victim": "batch", "step": s, "count": 1} for s in SHED_STEPS],
        router={
            "url": "http://127.0.0.1:8080",
            "models": {"tiny": {"last_request": None}, "kv": {"last_request": None}},
            "unloads": [
                {"model": "tiny", "reason": "memory", "count": 1},
                {"model": "kv", "reason": "pressure", "count": 1},
            ],
        },
    )
    out: dict[str, dict[str, set[str]]] = {}
    for fam in text_string_to_metric_families(exposition(run).decode()):
        for s in fam.samples:
            labels = out.setdefault(s.name, {})
            for k, v in s.labels.items():
                labels.setdefault(k, set()).add(v)
    return out


def _unknown(expr: str, exported: dict[str, dict[str, set[str]]]) -> list[str]:
    """What of ``expr`` the collector does not export: a name, a label, a fixed label value."""
    bad = []
    for name, braces in selectors(expr):
        if name not in exported:
            bad.append(f"metric {name}")
            continue
        for label, op, value in matchers(braces):
            if label not in exported[name] and label not in SCRAPE_LABELS:
                bad.append(f"label {name}{{{label}}}")
            elif "$" not in value and op in ("=", "=~") and label in exported[name]:
                alternatives = value.split("|") if op == "=~" else [value]
                bad += [
                    f'value {name}{{{label}="{a}"}}'
                    for a in alternatives
                    if a not in exported[name][label]
                ]
    return bad


@pytest.fixture(scope="module")
def board() -> dict[str, Any]:
    return dashboard.load()


def test_the_dashboard_is_a_grafana_model_with_unique_ids_and_a_grid(board: dict[str, Any]) -> None:
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36  # Grafana 10/11
    panels = list(dashboard._panels(board["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    for p in panels:
        grid = p["gridPos"]
        assert {"h", "w", "x", "y"} <= set(grid), p["title"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["title"] and p["targets"], p
        assert p["datasource"] == DS, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["refId"], (p["title"], t)
            assert t["datasource"] == DS, (p["title"], t)
    # no two panels overlap on the grid
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells.get((x, y)))
                cells[(x, y)] = p["title"]


def test_the_datasource_and_policy_are_template_variables(board: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    policy = variables["policy"]
    assert policy["type"] == "query" and policy["datasource"] == DS
    assert policy["query"]["query"] == "label_values(governor_engine_up, policy)"
    assert policy["multi"] and policy["includeAll"]
    # every per-slice query is filtered by the variable (a multi-value one: a regex match)
    for q in dashboard.queries(board):
        for name, braces in selectors(q.expr):
            if not name.startswith("governor_board_"):
                assert ("policy", "=~", "$policy") in matchers(braces), (q.panel, q.expr)


def test_every_query_names_series_labels_and_values_the_collector_exports(
    board: dict[str, Any], tmp_path: Path
) -> None:
    exported = _exported(tmp_path)
    found = dashboard.queries(board)
    assert len(found) >= 20
    unknown = {f"{q.panel}/{q.ref}": _unknown(q.expr, exported) for q in found}
    assert {k: v for k, v in unknown.items() if v} == {}
    drawn = {name for q in found for name, _ in selectors(q.expr)}
    for family in (  # what issue 48 asks the dashboard to show
        "governor_board_budget_bytes",
        "governor_board_claimed_bytes",
        "governor_memory_bytes",
        "governor_memory_limit_bytes",
        "governor_memory_events_total",
        "governor_pressure_memory_stalled_seconds_total",
        "governor_shed_total",
        "governor_model_unloads_total",
        "governor_model_memory_bytes",
        "governor_engine_up",
        "governor_policy_drift",
    ):
        assert family in drawn, family


@pytest.mark.parametrize(
    ("expr", "unknown"),
    [
        ('governor_memory_byte{policy=~"$policy"}', ["metric governor_memory_byte"]),
        ('governor_memory_bytes{polcy=~"$policy"}', ["label governor_memory_bytes{polcy}"]),
        (
            'governor_memory_bytes{kind=~"anon|filee"}',
            ['value governor_memory_bytes{kind="filee"}'],
        ),
        ('sum by (kind) (rate(governor_cpu_usage_seconds_total{job="x"}[5m]))', []),
        ("max without (instance, job) (governor_board_budget_bytes)", []),
        ("node_memory_MemTotal_bytes", ["metric node_memory_MemTotal_bytes"]),
    ],
)
def test_the_checker_catches_a_renamed_metric_a_broken_matcher_and_a_wrong_value(
    tmp_path: Path, expr: str, unknown: list[str]
) -> None:
    assert _unknown(expr, _exported(tmp_path)) == unknown


def test_a_panel_without_the_datasource_variable_is_refused(board: dict[str, Any]) -> None:
    broken = copy.deepcopy(board)
    target = next(p for p in broken["panels"] if p["type"] != "row")
    target["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
    with pytest.raises(AssertionError):
        test_the_dashboard_is_a_grafana_model_with_unique_ids_and_a_grid(broken)
