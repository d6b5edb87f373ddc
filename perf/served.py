"""perf/served: the supervisor of a cached launch of a served engine, next to `-- true`'s.

    python -m perf.served [--runs 3] [--settle 3] [--allow-missing auto|LIST]

The engine is a llama-server stand-in: a small Python HTTP server named `llama-server` (so its
--host/--port make the ready URL, /health) under a policy with a shed rule and two PSI rules
(issue 32: the lean supervisor for an engine with a ready URL and a shed rule). A warm-up launch
fills the plan cache; then each round launches it again (a hit), reads the supervisor's
/proc/PID/smaps_rollup `settle` seconds after the start, and, in a separate run of the same
launch in one interpreter, the modules it loaded (`governor.main.main`, then sys.modules).
Prints the medians (MiB) and the module count. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perf.launch import cgroup_mount, compile_governor, missing_controllers, user_env

SERVER = """\
import http.server, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
srv.timeout = 0.2
end = time.monotonic() + float(sys.argv[sys.argv.index("--serve-s") + 1])
while time.monotonic() < end:
    srv.handle_request()
"""

POLICY = """\
name = "bench-served"
slice = "bench-served.slice"
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
[[pressure]]
when = "cpu some 500ms/2s"
do = ["log"]
cooldown = "10s"
"""

PROBE = """\
import json, sys
from governor.main import main
code = main(json.loads(sys.argv[2]))
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _smaps(pid: int) -> tuple[float, float, float]:
    """PSS, USS (Private_*) and RSS in MiB."""
    kib: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        kib[key] = int(value.split()[0])
    uss = kib["Private_Clean"] + kib["Private_Dirty"]
    return kib["Pss"] / 1024, uss / 1024, kib["Rss"] / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--settle", type=float, default=3.0, help="seconds after the start")
    p.add_argument("--allow-missing", default="auto")
    a = p.parse_args()
    env = user_env()
    compile_governor(env)
    mount = cgroup_mount()
    allow = missing_controllers(mount) if a.allow_missing == "auto" else a.allow_missing
    with tempfile.TemporaryDirectory(prefix="bench-served.") as d:
        tmp = Path(d)
        env["GOVERNOR_CACHE_DIR"] = str(tmp / "cache")
        exe = tmp / "llama-server"
        exe.write_text(f"#!{sys.executable} -IS\n" + SERVER)
        exe.chmod(0o755)
        model = tmp / "model.bin"
        model.write_bytes(b"not a gguf")
        policy = tmp / "p.toml"
        policy.write_text(POLICY)

        def args(serve_s: float) -> list[str]:
            return [
                *("--cgroup-root", str(mount), "launch", "--allow-missing", allow),
                *("-p", str(policy), "--", str(exe), "-m", str(model), "-c", "512"),
                *("-np", "1", "--host", "127.0.0.1", "--port", str(_port())),
                *("--serve-s", str(serve_s)),
            ]

        def launch(serve_s: float) -> subprocess.Popen[bytes]:
            argv = [sys.executable, "-m", "governor", *args(serve_s)]
            return subprocess.Popen(argv, env=env, cwd=tmp, stderr=subprocess.DEVNULL)

        launch(0.5).wait(60)  # the miss: compiles and stores
        mems: list[tuple[float, float, float]] = []
        for _ in range(a.runs):
            proc = launch(a.settle + 2)
            time.sleep(a.settle)
            mems.append(_smaps(proc.pid))
            proc.wait(60)
        out = tmp / "modules.json"
        probe = [sys.executable, "-c", PROBE, str(out), json.dumps(args(0.5))]
        subprocess.run(probe, env=env, cwd=tmp, stderr=subprocess.DEVNULL, check=True)
        modules = json.loads(out.read_text())["modules"]
    pss, uss, rss = (statistics.median(m[i] for m in mems) for i in range(3))
    print(f"perf/served: {a.runs} cached launches, measured {a.settle:g} s after the start")
    print(f"  supervisor PSS {pss:.2f} MiB, USS {uss:.2f} MiB, RSS {rss:.2f} MiB")
    governor = sum(m.startswith("governor") for m in modules)
    print(f"  modules loaded by the supervisor: {len(modules)} ({governor} governor.*)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
