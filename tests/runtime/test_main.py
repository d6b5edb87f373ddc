"""The lean `governor launch` (governor/main.py) imports no compile-time stack, hit or miss: a
real launch in a fresh interpreter, then the names in sys.modules of that interpreter (the
supervisor). A miss compiles in a short-lived child (governor/api/isolate.py): the test sees
the entry it stored, and the supervisor's modules hold none of the compiler (without the child
they held pydantic, typer, the policy models and the compiler: the check can fail).

Not only with /bin/true (issue 32): a llama-server-like engine (a small Python HTTP server
answering /health, named llama-server so its --host/--port make the ready URL) under a policy
with a shed rule and a PSI rule, with --metrics, launched twice (a miss, then a hit): the
supervisor waited for /health, armed the rules, served /metrics, and still holds none of the
deny list (dataclasses, inspect and tokenize came with supervise/ready.py's dataclass).

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
    "governor.policy",
    "governor.compile",
    "governor.engines",
    "governor.cli.app",
    "governor.api.operate",
    "governor.api.compile",
)
# what the supervisor of a served engine must not hold either: dataclasses pulls inspect, which
# pulls tokenize, ast and dis (the cost governor/record.py exists to avoid)
RUN_TIME_DENY = (*COMPILE_TIME, "dataclasses", "inspect", "tokenize", "ast", "dis")

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
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), json.dumps(args)],
        cwd=governor.workdir,
        env=governor.env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        text=True,
        check=True,
    )
    result = json.loads(out.read_text())
    assert result["code"] == 0, run.stderr
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
    assert [m for m in first if any(m == n or m.startswith(n + ".") for n in COMPILE_TIME)] == []
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


# llama-server's stand-in: /health answers 200 once it is up; it exits by itself a little after
# the first /health (the supervisor's ready wait) was answered
_SERVER = """\
import http.server, sys, threading
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        if self.path == "/health":
            threading.Timer(1.0, srv.shutdown).start()
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
srv.serve_forever()
"""

SERVED_POLICY = """\
[engine]
kind = "llama.cpp"

[prefetch]
mode = "none"

[qos]
class = "interactive"

[[pressure]]
when = "board memory some 150ms/1s"
do = ["log", "shed"]
cooldown = "10s"

[[pressure]]
when = "memory some 150ms/2s"
do = ["log"]
cooldown = "10s"
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_served_engine_with_a_ready_url_metrics_and_a_shed_rule_loads_no_deny_listed_module(
    governor: Governor, tmp_path: Path
) -> None:
    exe = governor.workdir / "llama-server"
    exe.write_text(f"#!{sys.executable} -IS\n" + _SERVER)
    exe.chmod(0o755)
    model = governor.workdir / "model.bin"
    model.write_bytes(b"not a gguf")
    engine = [str(exe), "-m", str(model), "-c", "512", "-np", "1", "--host", "127.0.0.1"]
    policy = governor.policy(SERVED_POLICY)
    seen: dict[str, set[str]] = {}
    for n, metrics in (("miss", False), ("hit", False), ("hit with --metrics", True)):
        options = ("--metrics", f"127.0.0.1:{_free_port()}") if metrics else ()
        args = governor.args(policy, [*engine, "--port", str(_free_port())], *options)
        seen[n] = _modules_after_launch(governor, args, tmp_path / f"{len(seen)}.json")
        assert len(_entries(governor)) == 1  # the miss stored it; a hit (new port) found it
    for n, modules in seen.items():
        # the supervisor did wait for /health and arm the rules in this interpreter
        for name in ("governor.supervise.supervisor", "governor.supervise.ready"):
            assert _loaded(modules, name), (n, name)
        assert _loaded(modules, "governor.monitor.shed"), n
        assert _loaded(modules, "prometheus_client") is n.endswith("--metrics")
        # prometheus_client itself imports inspect (and with it tokenize, ast, dis): the price
        # of --metrics, which only that option pays; dataclasses and the compiler never
        deny = (*COMPILE_TIME, "dataclasses") if n.endswith("--metrics") else RUN_TIME_DENY
        assert [m for m in modules if any(m == d or m.startswith(d + ".") for d in deny)] == [], n
    print(f"modules loaded by a cached llama-server launch: {len(seen['hit'])}")
