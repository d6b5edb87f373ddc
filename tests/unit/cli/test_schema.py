"""`governor schema` (the JSON Schema of the policy language, generated from the models) and the
committed copy in policies/schema.json, which editors and other tools read.

Needs: nothing but the repository. After an intended change to the policy models, regenerate
the committed copy with GOVERNOR_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.golden import update_requested

from governor.api import compile as api_compile
from governor.cli.app import main

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "policies" / "schema.json"


def _cli_schema(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(["schema"])
    assert info.value.code == 0
    out, _ = capsys.readouterr()
    return out


def test_committed_schema_matches_governor_schema(capsys: pytest.CaptureFixture[str]) -> None:
    out = _cli_schema(capsys)
    if update_requested():
        COMMITTED.write_text(out)
    assert COMMITTED.read_text() == out, (
        "policies/schema.json is stale: rerun with GOVERNOR_UPDATE_GOLDEN=1 and review the diff"
    )


def test_schema_is_deterministic() -> None:
    """The same bytes from separate processes (set and dict orders vary with the hash seed),
    and the same bytes as the committed copy: no run can reorder what editors read."""
    outs = []
    for seed in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-m", "governor", "schema"],
            capture_output=True,
            text=True,
            check=False,
            cwd=REPO,
            env=dict(os.environ, PYTHONHASHSEED=seed),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1] == COMMITTED.read_text()
    assert api_compile.schema() == json.loads(outs[0])


def _section(schema: dict[str, Any], name: str) -> dict[str, Any]:
    section: dict[str, Any] = schema["$defs"][name]
    return section


def test_schema_rejects_unknown_keys_in_every_table() -> None:
    schema = api_compile.schema()
    assert schema["additionalProperties"] is False
    for name, definition in schema["$defs"].items():
        assert definition.get("additionalProperties") is False, name


def test_schema_names_the_contract_keys() -> None:
    schema = api_compile.schema()
    assert {"name", "description", "extends", "slice"} <= set(schema["properties"])
    assert schema["required"] == ["name"]
    memory = _section(schema, "MemorySection")["properties"]
    assert set(memory) == {
        "min", "low", "high", "max", "swap_max", "zswap_max", "zswap_writeback", "oom_group",
    }  # fmt: skip
    assert set(_section(schema, "CpuSection")["properties"]) == {"cpus", "weight", "max"}
    rule = _section(schema, "PressureRule")["properties"]
    assert {"when", "for", "do", "cooldown"} <= set(rule)  # "for", not the Python alias "for_"
    assert "for_" not in rule
    process = _section(schema, "ProcessSection")["properties"]
    assert {"user", "group", "oom_score_adj", "nice", "memlock", "env"} <= set(process)


def test_schema_shows_the_value_syntax_users_write() -> None:
    schema = api_compile.schema()
    high = _section(schema, "MemorySection")["properties"]["high"]
    text = json.dumps(high)
    assert '"type": "integer"' in text
    assert "1.5GiB" in text
    assert "70%" in text
    oom_group = _section(schema, "MemorySection")["properties"]["oom_group"]
    assert {"type": "boolean"} in oom_group["anyOf"]
    weight = _section(schema, "CpuSection")["properties"]["weight"]
    assert {"type": "integer", "minimum": 1, "maximum": 10000} in weight["anyOf"]
