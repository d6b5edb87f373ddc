"""The trigger table (governor/monitor/triggers.py) is the one list of rule kinds (issue 44 item
2): every row names a grammar, a compile and an evidence function that exist, the policy
parser and the schema read the kinds from it, no module outside it compares a rule's kind with
a name, and a new trigger is one row plus its module: ``always`` below, registered by this test
alone, is parsed from a policy, compiled into a plan that round-trips, and fires in a rule
engine step. Needs: nothing (the rk3588 host fixture)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest

from governor.compile.compiler import _watch_trigger, compile_plan, when_text
from governor.monitor import triggers
from governor.monitor.rules import Observations, Rule, RuleEngine, Verdict
from governor.plan.host import probe
from governor.plan.model import Plan, WatchCondition, WatchTrigger
from governor.policy import values as v
from governor.policy.loader import load_text
from governor.policy.model import Policy

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"


@pytest.mark.parametrize("kind", list(triggers.TRIGGERS))
def test_every_row_names_its_grammar_compile_and_evidence(kind: str) -> None:
    row = triggers.row(kind)
    assert callable(triggers.load(row.parse))
    compiler = triggers.load(row.compile)
    assert callable(compiler.watch) and callable(compiler.text)
    assert callable(triggers.load(row.evidence))
    assert set(row.sources) <= set(get_args(triggers.Source))
    assert row.semantics in get_args(triggers.Semantics)


# each kind in the policy's spelling, with the canonical text `governor plan` prints
FORMS = [
    ("memory some 150ms/2s", "psi", "memory some 150ms/2s"),
    ("board memory full 100ms/1s", "psi", "board memory full 100ms/1s"),
    ("leak > 500KB/s for 60s", "leak", "leak > 512000B/s for 60s"),
    ("memavailable < 800M", "memavailable", "memavailable < 838860800"),
    ("board available < 200M", "available", "board available < 209715200"),
    ("board  available<headroom", "headroom", "board available < headroom"),
    ("device memory > 1G", "device", "device memory > 1073741824"),
    ("refaults > 12.5%/10s", "refaults", "refaults > 12.5%/10s"),
    ("board refaults > 50%/4s", "board_refaults", "board refaults > 50%/4s"),
    ("board file < 1G", "board_file", "board file < 1073741824"),
    (" oom_group_kill ", "event", "oom_group_kill"),
]


@pytest.mark.parametrize(("text", "kind", "plan_text"), FORMS)
def test_the_table_picks_each_forms_kind_through_parse_and_compile(
    text: str, kind: str, plan_text: str
) -> None:
    assert triggers.grammar_for(text).kind == kind
    when = v.parse_condition(text)
    assert triggers.grammar_for(str(when)).kind == kind  # the compiler finds the row so
    got = _watch_trigger(when)
    if isinstance(got, WatchTrigger):
        assert (kind, when_text(got)) == ("psi", str(when).removeprefix("board "))
        return
    assert got.condition == kind
    assert got.text() == plan_text
    assert v.parse_condition(when_text(got)) == when or kind in ("leak", "headroom")


def test_every_kind_is_in_the_table_and_in_the_schema() -> None:
    assert set(triggers.TRIGGERS) == {k for _, k, _ in FORMS}
    rule = Policy.model_json_schema()["$defs"]["PressureRule"]
    described = rule["properties"]["when"]["description"]
    assert described == triggers.usage()
    for row in triggers.TRIGGERS.values():
        assert row.usage is None or row.usage in described


# the modules that used to spell the kinds in a ladder (issue 44: "headroom" in six files)
NO_KIND_LADDER = (
    "governor/monitor/rules.py",
    "governor/monitor/loop.py",
    "governor/monitor/sources.py",
    "governor/plan/model.py",
    "governor/compile/compiler.py",
    "governor/policy/values.py",
)


def _kind_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing a ``.kind`` or ``.condition`` with a trigger kind's name (``r.kind ==
    "leak"``, ``"refaults" in r.kind``, ``t.condition in ("device", "headroom")``)."""
    kinds = set(triggers.TRIGGERS)

    def named(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr in ("kind", "condition")

    def text(node: ast.expr) -> bool:
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(text(e) for e in node.elts)
        return isinstance(node, ast.Constant) and any(k in str(node.value) for k in kinds)

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s) for s in sides) and any(text(s) for s in sides):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", NO_KIND_LADDER)
def test_no_module_outside_the_table_compares_a_kind_with_a_name(path: str) -> None:
    tree = ast.parse((REPO / path).read_text())
    assert _kind_comparisons(tree) == [], path


def test_the_ladder_check_sees_a_ladder() -> None:
    """The check above is not vacuous: the old spellings are caught."""
    for code in (
        'r.kind == "leak"',
        '"refaults" in r.kind',
        't.condition in ("device", "headroom")',
    ):
        assert _kind_comparisons(ast.parse(code)) == [1], code


# ------------------------------------------------------------------ a new trigger: `always`
# Its module (here: this test file): a grammar, a compile, an evidence function; its row below.


@dataclass(frozen=True)
class AlwaysCondition:
    def __str__(self) -> str:
        return "always"


def parse_always(value: str) -> AlwaysCondition:
    if value.strip() != "always":
        raise ValueError(f"cannot parse {value!r} (form: 'always')")
    return AlwaysCondition()


class AlwaysCompile:
    @staticmethod
    def watch(when: AlwaysCondition, site: Any) -> WatchCondition:
        return WatchCondition(condition="always", file="-")

    @staticmethod
    def text(t: WatchCondition) -> str:
        return "always"


def always_evidence(rule: Rule, st: Any, now: float, obs: Observations) -> Verdict:
    return True, None, False


ALWAYS = triggers.Trigger(
    "always",
    r"always\b",
    f"{__name__}:parse_always",
    f"{__name__}:AlwaysCompile",
    "'always' (a test's trigger)",
    "level",
    (),
    f"{__name__}:always_evidence",
    "always",
)


@pytest.fixture
def always() -> Iterator[triggers.Trigger]:
    triggers.register(ALWAYS)
    yield ALWAYS
    triggers.unregister(ALWAYS.kind)


def test_a_new_trigger_is_one_row_and_its_module(always: triggers.Trigger) -> None:
    policy = load_text(
        'name = "t"\n[memory]\nmax = "512M"\n[[pressure]]\nwhen = "always"\ndo = ["log"]\n',
        source="t.toml",
    )
    assert isinstance(policy.pressure[0].when, AlwaysCondition)
    plan = compile_plan(policy, probe(HOSTS / "rk3588", target="governor.slice/t"))
    (rule,) = plan.watch
    assert rule.when == "always" and rule.trigger == WatchCondition(condition="always", file="-")
    assert Plan.from_json(plan.to_json()) == plan  # the plan cache and the run state keep it
    assert isinstance(rule.trigger, WatchCondition) and rule.trigger.text() == "always"
    engine = RuleEngine([Rule.from_watch(rule)])
    fired = engine.step(1.0, Observations())
    assert [(f.rule.index, f.rule.when) for f in fired] == [(0, "always")]
    assert engine.step(2.0, Observations()) == []  # a level: once per episode


def test_an_unregistered_trigger_is_refused_with_the_forms() -> None:
    with pytest.raises(ValueError, match="cannot parse trigger 'always'"):
        v.parse_condition("always")


def test_the_monitor_loop_loads_the_leak_detector_only_for_a_rule_that_samples_it() -> None:
    """The supervisor pays for the table's module, not for a meter its plan does not use."""
    code = (
        "import sys, governor.monitor.loop as loop; a = 'governor.monitor.leak' in sys.modules;"
        " from governor.monitor import triggers; triggers.meter('leak');"
        " print(a, 'governor.monitor.leak' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.split() == ["False", "True"]
