"""The verb registry (governor/monitor/actions/registry.py) is the one list of action verbs:
every entry names a handler that exists, the policy parser and the manual spell the verbs from
it, it costs the compile time none of the run time's modules, and the monitor loop names no
verb."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from governor.cli.manual.keys import KEYS
from governor.monitor.actions import registry
from governor.monitor.actions.base import Handler
from governor.policy.values import parse_action

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("verb", list(registry.VERBS))
def test_every_registered_verb_names_a_handler_class(verb: str) -> None:
    cls = registry.handler_class(verb)
    assert isinstance(cls, type) and issubclass(cls, Handler) and cls is not Handler
    assert cls.run is not Handler.run


def test_the_policy_and_the_manual_spell_the_verbs_from_the_registry() -> None:
    with pytest.raises(ValueError) as err:
        parse_action("nap")
    assert str(err.value).endswith(f"(known: {', '.join(registry.names())})")
    assert registry.usage() in KEYS["pressure.do"][0]
    no_args = [v for v, spec in registry.VERBS.items() if spec.args == "none"]
    assert [parse_action(v).verb for v in no_args] == no_args


def _loaded(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; {code}; import json; "
         "print(json.dumps(sorted(m for m in sys.modules if m.startswith('governor.monitor'))))"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_the_policy_parser_reads_the_registry_without_the_run_time() -> None:
    assert _loaded("import governor.policy.values") == [
        "governor.monitor",
        "governor.monitor.actions",
        "governor.monitor.actions.registry",
        "governor.monitor.triggers",  # the trigger kinds' table (issue 44), the same kind
    ]


def test_the_monitor_loads_a_handler_only_when_a_plan_uses_its_verb() -> None:
    loaded = _loaded("import governor.monitor.loop")
    assert "governor.monitor.actions.executor" in loaded
    handlers = {v.handler.partition(":")[0] for v in registry.VERBS.values()}
    assert not handlers & set(loaded)  # shedder, victims, ownstall: only with a `shed` rule
    assert "governor.monitor.victims" not in loaded


def test_the_monitor_loop_names_no_verb() -> None:
    tree = ast.parse((REPO / "governor" / "monitor" / "loop.py").read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert not strings & set(registry.VERBS)
    assert not strings & {"throttle", "unshed", "shed_totals"}
