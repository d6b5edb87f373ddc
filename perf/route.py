"""perf/route: how many of the governor's functions a cold launch passes through before the
supervisor runs (issue 44's "route of `[memory] high` from a cold launch to the supervisor").

    python -m perf.route [--repo DIR] [--show]

Runs `governor launch --policy P -- true` in a child interpreter with an empty plan cache (the
launch compiles), P = perf/launch.py's policy plus `[memory] high`, and a trace function that
records every governor function called (its module and qualified name) until the call of
``Supervisor.run``: the distinct functions are the stays on the route from the policy file to
the process that enforces it. ``--repo`` measures another checkout (e.g. a `git archive` of an
older commit) with this one's script; ``--show`` lists the functions per module.

A count, not a time: the same on a loaded machine. Controllers the host's cgroup2 mount lacks
are passed to --allow-missing (the route through the compiler is the same; the write itself is
the backend's last step either way). Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from perf.launch import POLICY, cgroup_mount, missing_controllers

REPO = Path(__file__).resolve().parents[1]

TRACER = r"""
import json, sys
out, argv = sys.argv[1], sys.argv[2:]
seen = {}
def tracer(frame, event, arg):
    code = frame.f_code
    path = code.co_filename
    if "/governor/" not in path or "/perf/" in path:
        return None
    name = code.co_qualname
    if name == "Supervisor.run":
        with open(out, "w") as f:
            json.dump(sorted(seen), f)
        sys.settrace(None)
        return None
    module = path.rsplit("/governor/", 1)[1]
    seen.setdefault(f"{module}:{name}", None)
    return None
sys.settrace(tracer)
sys.argv = ["governor", *argv]
import runpy
runpy.run_module("governor", run_name="__main__")
"""


def route(repo: Path, policy: Path, allow: str, tmp: Path) -> list[str]:
    out = tmp / f"route-{os.getpid()}-{repo.name}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(repo)
    env["GOVERNOR_CACHE_DIR"] = str(tempfile.mkdtemp(dir=tmp))  # cold: the launch compiles
    argv = ["launch", "--policy", str(policy)]
    if allow:
        argv += ["--allow-missing", allow]
    argv += ["--", "true"]
    subprocess.run(
        [sys.executable, "-c", TRACER, str(out), *argv],
        env=env,
        cwd=repo,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    if not out.exists():
        raise SystemExit(f"perf.route: the launch from {repo} never reached Supervisor.run")
    names: list[str] = json.loads(out.read_text())
    return names


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repo", type=Path, default=REPO)
    p.add_argument("--show", action="store_true")
    a = p.parse_args()
    mount = cgroup_mount()
    allow = missing_controllers(mount)
    with tempfile.TemporaryDirectory(prefix="perf-route.") as d:
        tmp = Path(d)
        policy = tmp / "p.toml"
        policy.write_text(POLICY + '[memory]\nhigh = "1G"\n')
        names = route(a.repo.resolve(), policy, allow, tmp)
    modules = Counter(n.split(":", 1)[0] for n in names)
    print(
        f"{a.repo}: {len(names)} governor functions in {len(modules)} modules before Supervisor.run"
    )
    if a.show:
        for module, count in sorted(modules.items()):
            print(f"  {count:4d}  {module}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
