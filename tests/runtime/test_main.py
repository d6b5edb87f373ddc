"""The lean `governor launch` (governor/main.py) imports no compile-time stack, hit or miss: a
real launch in a fresh interpreter, then the names in sys.modules of that interpreter (the
supervisor). A miss compiles in a short-lived child (governor/api/isolate.py): the test sees
the entry it stored, and the supervisor's modules hold none of the compiler (without the child
they held pydantic, typer, the policy models and the compiler: the check can fail).

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
    "governor.compile.compiler",
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


def _entries(governor: Governor) -> list[str]:
    plans = governor.cache / "plans"
    return sorted(p.name for p in plans.iterdir()) if plans.is_dir() else []


def test_neither_a_miss_nor_a_hit_leaves_the_compile_time_stack_in_the_supervisor(
    governor: Governor, tmp_path: Path
) -> None:
    args = governor.args(governor.policy(), ["/bin/true"])
    assert _entries(governor) == []
    first = _modules_after_launch(governor, args, tmp_path / "first.json")
    assert len(_entries(governor)) == 1  # a miss: it compiled (in its child) and stored
    assert "governor.supervise.supervisor" in first  # the launch did run in this interpreter
    assert [n for n in COMPILE_TIME if _loaded(first, n)] == []
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
