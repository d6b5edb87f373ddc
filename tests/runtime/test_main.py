"""The lean `governor launch` (governor/main.py) imports no compile-time stack once the plan is
cached: a real launch in a fresh interpreter, then the names in sys.modules. The uncached
launch before it must import the compiler (else the check below could not fail).

Needs what tests/runtime/conftest.py says (root, cgroup2, PSI).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import Governor

COMPILE_TIME = (
    "pydantic",
    "typer",
    "click",
    "structlog",
    "governor.policy.model",
    "governor.plan.compiler",
    "governor.cli.app",
)

# governor.main.main(args), then what was imported, as JSON into argv[1]
_PROBE = """
import json, sys
from governor.main import main
args = json.loads(sys.argv[2])
code = main(args)
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""


def _modules_after_launch(governor: Governor, args: list[str], out: Path) -> set[str]:
    subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), json.dumps(args)],
        cwd=governor.workdir,
        env=governor.env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.read_text())
    assert result["code"] == 0
    return set(result["modules"])


def _loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(m.startswith(name + ".") for m in modules)


def test_a_cached_launch_imports_no_compile_time_module_and_an_uncached_one_does(
    governor: Governor, tmp_path: Path
) -> None:
    args = governor.args(governor.policy(), ["/bin/true"])
    first = _modules_after_launch(governor, args, tmp_path / "first.json")
    assert "governor.plan.compiler" in first  # a compile happened: the probe sees imports
    second = _modules_after_launch(governor, args, tmp_path / "second.json")
    assert "governor.supervise.supervisor" in second  # the launch did run in this interpreter
    assert [n for n in COMPILE_TIME if _loaded(second, n)] == []
    assert not _loaded(second, "prometheus_client")  # only --metrics imports it


def test_a_cached_launch_with_metrics_imports_prometheus_client_and_still_no_compile_time(
    governor: Governor, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = governor.args(governor.policy(), ["/bin/true"], "--metrics", f"127.0.0.1:{port}")
    _modules_after_launch(governor, args, tmp_path / "first.json")
    second = _modules_after_launch(governor, args, tmp_path / "second.json")
    assert "governor.supervise.supervisor" in second
    assert _loaded(second, "prometheus_client")
    assert [n for n in COMPILE_TIME if _loaded(second, n)] == []
