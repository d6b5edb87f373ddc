#!/usr/bin/env python3
"""llama-server's memory and first-request latency: bare with llama.cpp's defaults vs under
`governor launch` with the policy `governor init` writes for a board.

    .venv/bin/python -m perf.server [--conversations 12] [--words 2600] [--repeat 3]

The server is scripts/engine-setup's llama-server with the KV-heavy kvserver model (32 layers
x n_embd 512: 64 KiB of KV per token), `-c 4096 -np 1 -t 2` and the chatml template (the
synthetic models carry none), driven by the `openai` client (tests/helpers/server.py). Two
parts, every governor run through the console script with bytecode compiled (perf/launch.py):

1. Growth: the server's resident memory (RSS and PSS from /proc/PID/smaps_rollup) at ready
   and after each of N distinct conversations (one ~WORDS-token prompt each, no shared
   prefix, so every one is a new saved state in the prompt cache), one conversation at a
   time: ``bare`` (llama.cpp's defaults: --cache-ram 8192 MiB) against ``governor``
   (`governor launch` with the init policy for --board-memory and the command line init
   prints, i.e. its --cache-ram). This host has no memory controller on cgroup2 (hybrid), so
   the policy's memory.max is not in force here (--allow-missing): what is measured is the
   server's own growth, which the --cache-ram init chose bounds.
2. First request: spawn to /health 200, and spawn to the first streamed token of one short
   conversation (``first token``) and to its whole answer (``first answer``), cold (page
   cache dropped before the spawn, root) and warm, bare vs governor with the init policy's
   [prefetch] mode = "populate" (and "none", the governor's own cost). Runs interleaved round
   by round, median of --repeat; one port for all, the plan cache warmed by one run of each
   governor variant (a restarted service keeps its port).

Prints the curve, the medians and the ratios governor / bare from this one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf._helpers.server import KVSERVER, SERVER, chat, free_port, prompt, wait_ready
from perf.launch import cgroup_mount, compile_governor, governor_argv, missing_controllers, user_env

REPO = Path(__file__).resolve().parents[1]

MIB = 1 << 20


@dataclass
class Memory:
    rss: int
    pss: int


def memory(pid: int) -> Memory:
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if words and words[-1] == "kB":
            fields[key] = int(words[0]) * 1024
    return Memory(rss=fields["Rss"], pss=fields["Pss"])


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def server_pid(proc: subprocess.Popen[str], binary: Path, timeout: float = 30.0) -> int:
    """The llama-server process: `proc` itself (bare) or the governor's child running it."""
    deadline = time.monotonic() + timeout
    want = binary.resolve()
    while True:
        pending = [proc.pid]
        while pending:
            pid = pending.pop()
            try:
                if Path(f"/proc/{pid}/exe").resolve() == want:
                    return pid
                for task in Path(f"/proc/{pid}/task").iterdir():
                    pending += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"perf/server: no {binary.name} under pid {proc.pid}")
        time.sleep(0.05)


class Server:
    """One server run: spawned, ready, stopped with SIGTERM (exit status checked)."""

    def __init__(self, argv: list[str], env: dict[str, str], binary: Path, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by stop())
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=self.log, text=True, cwd=REPO
        )
        self.binary = binary
        self.argv = argv

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        if rc != 0:
            self.log.seek(0)
            tail = self.log.read()[-3000:]
            raise SystemExit(f"perf/server: {shlex.join(self.argv)} exited {rc}\n{tail}")
        self.log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=KVSERVER)
    ap.add_argument("--server", type=Path, default=SERVER)
    ap.add_argument("--ctx", type=int, default=4096, help="-c (default 4096)")
    ap.add_argument("--conversations", type=int, default=12, help="N (default 12)")
    ap.add_argument("--words", type=int, default=2600, help="prompt tokens per conversation")
    ap.add_argument("--board-memory", default="2G", help="governor init --board-memory")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of the first-request runs")
    ap.add_argument("--latency-words", type=int, default=200, help="the first request's prompt")
    ap.add_argument("--allow-missing", default="auto", help="auto: what the cgroup2 mount lacks")
    ap.add_argument("--no-growth", action="store_true")
    ap.add_argument("--no-latency", action="store_true")
    a = ap.parse_args(argv)
    for path in (a.server, a.model):
        if not path.exists():
            raise SystemExit(f"perf/server: {path} missing: run scripts/engine-setup")
    env = user_env()
    compile_governor(env)
    mount = cgroup_mount()
    allow = missing_controllers(mount) if a.allow_missing == "auto" else a.allow_missing
    port = free_port()
    common = ["-np", "1", "-t", "2", "--host", "127.0.0.1", "--port", str(port),
              "--chat-template", "chatml", "--no-webui"]  # fmt: skip
    bare = [str(a.server), "-m", str(a.model), "-c", str(a.ctx), *common]
    uname = os.uname()
    print(f"perf/server on {uname.nodename}: kernel {uname.release}, {os.cpu_count()} cpus,"
          f" cgroup2 {mount} (missing: {allow or 'none'})")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="governor-perf-server-") as tmp:
        env["GOVERNOR_CACHE_DIR"] = str(Path(tmp) / "cache")
        policy = Path(tmp) / "server.toml"
        res = subprocess.run(
            [*governor_argv(), "init", "--model", str(a.model), "--ctx", str(a.ctx),
             "--board-memory", a.board_memory, "--engine-argv", shlex.join([str(a.server), *common]),
             "-o", str(policy)],
            env=env, capture_output=True, text=True, check=False, cwd=REPO,
        )  # fmt: skip
        if res.returncode != 0:
            raise SystemExit(f"perf/server: governor init failed ({res.returncode}):\n{res.stderr}")
        text = policy.read_text()
        line = next(x for x in text.splitlines() if x.startswith("#   governor launch "))
        words = shlex.split(line[1:])
        engine = words[words.index("--") + 1 :]
        conf = tomllib.loads(text)
        extra = ["--allow-missing", allow] if allow else []

        def governed(mode: str) -> list[str]:
            path = Path(tmp) / f"server-{mode}.toml"
            path.write_text(text.replace('mode = "populate"', f'mode = "{mode}"'))
            return [*governor_argv(), "launch", "--policy", str(path), *extra, "--", *engine]

        print(f"model {a.model} ({a.model.stat().st_size / MIB:.0f} MiB); bare: "
              f"{shlex.join(bare[1:])}")  # fmt: skip
        print(f"governor: init --board-memory {a.board_memory}: memory.max {conf['memory']['max']},"
              f" engine.max_cache_ram {conf['engine'].get('max_cache_ram')} MiB; engine:"
              f" {shlex.join(engine[1:])}")  # fmt: skip
        estimates = {name: estimate(a.model, cmd, env) for name, cmd in (("bare", bare),
                                                                            ("governor", engine))}  # fmt: skip
        for name, e in estimates.items():
            print(f"governor estimate, {name}: {e['total'] / MIB:.0f} MiB ("
                  + ", ".join(f"{k} {v / MIB:.0f}" for k, v in e["terms"].items() if v) + ")")  # fmt: skip
        runs: dict[str, list[str]] = {"bare": bare, "governor": governed("populate")}
        if not a.no_growth:
            growth(a, env, runs, port, estimates)
        if not a.no_latency:
            latency(
                a,
                env,
                {
                    "bare": bare,
                    "governor prefetch=none": governed("none"),
                    "governor prefetch=populate": governed("populate"),
                },
                port,
            )
    return 0


def estimate(model: Path, engine: list[str], env: dict[str, str]) -> dict[str, Any]:
    """`governor estimate --json` of a server command line (its terms in bytes)."""
    res = subprocess.run(
        [*governor_argv(), "estimate", str(model), "--engine-argv", shlex.join(engine), "--json"],
        env=env, capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    got: dict[str, Any] = json.loads(res.stdout)
    return got


def growth(
    a: argparse.Namespace,
    env: dict[str, str],
    runs: dict[str, list[str]],
    port: int,
    estimates: dict[str, dict[str, Any]],
) -> None:
    curves: dict[str, list[Memory]] = {}
    seconds: dict[str, float] = {}
    for name, cmd in runs.items():
        s = Server(cmd, env, a.server, port)
        try:
            wait_ready(s.base, s.proc, timeout=300)
            pid = server_pid(s.proc, a.server)
            curve = [memory(pid)]
            t0 = time.perf_counter()
            for i in range(a.conversations):
                chat(s.base, i, prompt(i, a.words), 4)
                curve.append(memory(pid))
                print(f"  {name}: {i + 1}/{a.conversations}: RSS {curve[-1].rss / MIB:.0f} MiB"
                      f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
            seconds[name] = time.perf_counter() - t0
        finally:
            s.stop()
        curves[name] = curve
    print()
    print(f"1. resident memory after n distinct conversations (~{a.words + 53} prompt tokens"
          f" each, one at a time), MiB")  # fmt: skip
    names = list(curves)
    print(f"{'n':>3}  " + "  ".join(f"{n + ' RSS':>13} {n + ' PSS':>13}" for n in names)
          + f"  {'RSS gov/bare':>12}")  # fmt: skip
    for n in range(a.conversations + 1):
        row = "  ".join(
            f"{curves[k][n].rss / MIB:13.0f} {curves[k][n].pss / MIB:13.0f}" for k in names
        )
        ratio = curves["governor"][n].rss / curves["bare"][n].rss
        print(f"{n:3}  {row}  {ratio:12.2f}")
    last = {k: c[-1].rss for k, c in curves.items()}
    per = {k: (c[-1].rss - c[0].rss) / a.conversations for k, c in curves.items()}
    for k in names:
        total = estimates[k]["total"]
        bounded = total - estimates[k]["terms"]["prompt_cache"]
        print(f"  {k}: at ready {curves[k][0].rss / MIB:.0f} MiB, after {a.conversations}"
              f" {last[k] / MIB:.0f} MiB, +{per[k] / MIB:.0f} MiB per conversation on average"
              f" ({seconds[k]:.0f} s of conversations); its estimate {total / MIB:.0f} MiB"
              f" ({last[k] / total:.2f}x), {bounded / MIB:.0f} MiB without the prompt cache"
              f" ({last[k] / bounded:.2f}x)")  # fmt: skip
    print(
        f"  ratio governor/bare after {a.conversations}: RSS {last['governor'] / last['bare']:.2f}"
    )


def latency(
    a: argparse.Namespace,
    env: dict[str, str],
    runs: dict[str, list[str]],
    port: int,
) -> None:
    cold = os.geteuid() == 0
    results: dict[str, dict[str, list[float]]] = {}

    def one(cmd: list[str], i: int) -> tuple[float, float, float]:
        s = Server(cmd, env, a.server, port)
        try:
            wait_ready(s.base, s.proc, timeout=300, interval=0.005)
            ready = time.perf_counter() - s.t0
            answer = chat(s.base, i, prompt(1000 + i, a.latency_words), 4, True)
            total = time.perf_counter() - s.t0
        finally:
            s.stop()
        if answer.first_seconds is None or not answer.text:
            raise SystemExit(f"perf/server: no answer streamed from {shlex.join(cmd)}")
        # spawn to the request (= total - the request's own seconds) + request to first token
        return ready, total - answer.seconds + answer.first_seconds, total

    for name, cmd in runs.items():  # warm-up: page cache, plan cache (same port every run)
        if name != "bare":
            one(cmd, 0)
    temps = ("cold", "warm") if cold else ("warm",)
    for r in range(a.repeat):  # interleaved: drift hits every variant alike
        for temp in temps:
            for name, cmd in runs.items():
                if temp == "cold":
                    drop_caches()
                ready, first, total = one(cmd, r)
                got = results.setdefault(f"{temp}, {name}", {})
                for key, value in (("ready", ready), ("first token", first), ("answer", total)):
                    got.setdefault(key, []).append(value)
    print()
    print(f"2. first request from spawn, seconds, median of {a.repeat} ({a.latency_words + 53}"
          f" prompt tokens, 4 answered){'' if cold else '; not root: no cold runs'}")  # fmt: skip
    keys = ("ready", "first token", "answer")
    print(f"{'run':34} " + " ".join(f"{k:>12}" for k in keys) + "   first token, all runs")
    for name, got in results.items():
        meds = " ".join(f"{statistics.median(got[k]):12.3f}" for k in keys)
        all_runs = " ".join(f"{t:.3f}" for t in got["first token"])
        print(f"{name:34} {meds}   {all_runs}")
    print("ratios governor / bare (medians):")
    for temp in temps:
        base = results[f"{temp}, bare"]
        for name in runs:
            if name == "bare":
                continue
            got = results[f"{temp}, {name}"]
            ratios = "  ".join(
                f"{k} {statistics.median(got[k]) / statistics.median(base[k]):5.2f}" for k in keys
            )
            print(f"  {temp}, {name:28} {ratios}")


if __name__ == "__main__":
    sys.exit(main())
