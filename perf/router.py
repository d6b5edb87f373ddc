#!/usr/bin/env python3
"""llama-server's router with three models and a memory.max that fits two (issue 38): the
router alone (count-based eviction) vs under `governor launch` with [engine] evict = "memory".

    flock /tmp/governor-guest.lock .venv/bin/python -m perf.router --guest [--rounds 3]
    .venv/bin/python -m perf.router [--arms 1a,2a,3a]   # as root on a cgroup v2 kernel

Each arm runs --rounds times (the arms' order reversed every other round); the host writes
--out (default out/router): runs.csv (a row an arm's round), router.json (meta, rounds, summary),
router-latency.png and router-reread.png; per arm the median round beside the worst
(perf/router_report.py).

In the kernel guest (2 GiB, no swap): scripts/engine-setup's llama-server as a router over a
models directory of three copies of small.gguf (134 MiB each, distinct inodes on an ext4 loop
mount, so each model's weights are its own page cache), one request at a time in the order
PATTERN (a b c a b c a c b ..., each asking a model the previous one did not; 9 by default:
under TCG a load is ~30-60 s), a one-word prompt and 2 tokens an answer through the openai
client's /v1/completions. Arms, each with variants (a) `-c 512 --cache-ram 0` under
memory.max 628M, and (b) `-c 8192 --cache-ram 16` under 1400M (each child's KV cache makes it
~480 MiB of anonymous memory: two fit, three do not, whatever reclaim does):

  1  the router alone, --models-max 2, in a plain cgroup with that memory.max
  2  the router alone, --models-max 3, the same memory.max
  3  `governor launch` with a policy of the same memory.max, [engine] evict = "memory",
     --models-max 3: the governor unloads the least recently used idle model when a load
     would not fit

Variant (c), eviction by value (issue 46 item 2): model a is a small.gguf copy (slow to load),
b and c kvguest.gguf copies (13 MiB, quick), `-c 512 --cache-ram 0` under memory.max 375M
(a and one quick model fit, a and both do not), requests a b c a b c ... each the next turn of
that model's conversation (a raw prompt of two-letter words through /v1/completions, its
words so far and 3 new, one token answered: its time to first token), the router started with
--slot-save-path. Before each turn the client loads the model when the router does not list
it loaded (POST /models/load, timed until it does: the reload seconds), then, under the
governor, waits for its slot's restore. Arms 1c (the router alone, --models-max 2), 3c (the
governor, by value: b, cheap to bring back, gives way for c, a stays) and 4c (the governor
with the order before issue 46, least recently used first: a gives way; perf/governor_lru.py,
a bench switch). Its table: requests failed, OOM kills, weights re-read, loads per model and
their seconds, the governor's unloads, and the next turn's time to first token after its
model was reloaded, restored and not.

Per arm: requests failed, OOM kills (the group's memory.events oom_kill, hierarchical: the
router's leaf and the models' leaves too; in brackets the kernel log's "Killed process"
lines), peak memory (memory.peak, else the sampled max of memory.current), the weights
re-read (memory.stat workingset_refault_file from ready to the last answer, MiB), the
latency of the answered requests (median, max), the governor's unloads; the ratios of arms
1 and 2 to arm 3.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import openai

from perf._helpers.cgroup import read_kv
from perf._helpers.disk import loop_mount
from perf._helpers.engine_paths import SMALL
from perf._helpers.guest import commit
from perf._helpers.server import (
    KVGUEST,
    SERVER,
    SERVER_ARGS,
    client,
    free_port,
    prompt,
    wait_ready,
)
from perf.router_common import (
    MIB,
    MODELS,
    VARIANTS,
    Arm,
    Result,
    mix,
    parse_arms,
    table,
    value_table,
)
from perf.router_report import META_TAG, RUN_TAG, finish, in_guest, parser, to_json

REPO = Path(__file__).resolve().parents[1]
CGROUP = Path("/sys/fs/cgroup")
SLICE = "perfrouter.slice"
NAME = "router"
CONTROLLERS = ("cpu", "io", "memory", "pids")
# between requests, in every arm: the governor samples its model leaves' activity every 0.5 s
# (the least recently used idle model is the one it unloads)
PAUSE_S = 1.2
FIRST_WORDS, NEXT_WORDS = 12, 3  # variant c: a conversation's first turn, each next one
RESTORE_WAIT_S = 30.0  # variant c: for the governor's restore after a reload


def log(msg: str) -> None:
    print(f"perf/router: {msg}", flush=True)


def enable(path: Path, controllers: tuple[str, ...]) -> None:
    have = set((path / "cgroup.controllers").read_text().split())
    on = " ".join(f"+{c}" for c in controllers if c in have)
    (path / "cgroup.subtree_control").write_text(on)


def kill_tree(path: Path) -> None:
    """Everything in the cgroup tree killed and the directories removed (deepest first)."""
    if not path.is_dir():
        return
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 30
    for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        while time.monotonic() < deadline:
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.2)
    with contextlib.suppress(OSError):
        while path.exists() and time.monotonic() < deadline:
            try:
                path.rmdir()
            except OSError:
                time.sleep(0.2)


def drop_caches() -> None:
    """The models' clean pages out of the page cache: each arm faults them in again, charged
    to its own group (not to the previous arm's, removed)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def kernel_kills() -> int:
    out = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout
    return sum(1 for line in out.splitlines() if "Killed process" in line)


class Sampler(threading.Thread):
    """memory.current of the group every 0.2 s (the peak where memory.peak is missing)."""

    def __init__(self, group: Path) -> None:
        super().__init__(daemon=True)
        self.group, self.peak, self.stop = group, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                self.peak = max(self.peak, int((self.group / "memory.current").read_text()))
            self.stop.wait(0.2)


def ask(base: str, model: str, index: int, tokens: int) -> float:
    """One request: a one-word prompt of its own through /v1/completions (no chat template:
    under TCG a model's load, not its prompt, should be what a request costs), `tokens`
    answered."""
    t0 = time.perf_counter()
    client(base, timeout=900).completions.create(
        model=model, prompt=prompt(index, 1), max_tokens=tokens, extra_body={"ignore_eos": True}
    )
    return time.perf_counter() - t0


def engine_argv(models: Path, arm: Arm, port: int, slots: Path | None = None) -> list[str]:
    saves = [] if slots is None else ["--slot-save-path", str(slots)]
    return [str(SERVER), "--models-dir", str(models), "--models-max", str(arm.models_max),
            *VARIANTS[arm.variant].flags, "-t", "2", "--host", "127.0.0.1", "--port", str(port),
            *SERVER_ARGS, *saves]  # fmt: skip


def http(base: str, path: str, body: dict[str, object] | None = None) -> object:
    """GET (or POST ``body``) base/path; the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as answer:
        return json.loads(answer.read())


def status(base: str, model: str) -> str:
    """The router's status of ``model`` (GET /models): loaded, loading, unloaded, ..."""
    listing = http(base, "/models")
    for item in listing.get("data", []) if isinstance(listing, dict) else []:
        if item.get("id") == model:
            st = item.get("status")
            return str(st.get("value") if isinstance(st, dict) else st)
    return "missing"


def load(base: str, model: str, timeout: float = 900.0) -> float | None:
    """Load ``model`` unless the router has it; the seconds until it lists it loaded (None:
    it was loaded already)."""
    if status(base, model) in ("loaded", "sleeping"):
        return None
    t0 = time.perf_counter()
    http(base, "/models/load", {"model": model})
    while (st := status(base, model)) not in ("loaded", "sleeping"):
        if st in ("failed", "unloaded") and time.perf_counter() - t0 > 5:
            raise OSError(f"load of {model}: {st}")
        if time.perf_counter() - t0 > timeout:
            raise OSError(f"load of {model}: not loaded after {timeout:.0f} s")
        time.sleep(0.1)
    return time.perf_counter() - t0


def restores(run_dir: Path, model: str) -> list[list[int]]:
    """The governor's journaled slot restores of ``model`` (each: the slots restored)."""
    out = []
    with contextlib.suppress(OSError):
        for line in (run_dir / NAME / "journal.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                e = json.loads(line)
                if e.get("source") == "slots" and e.get("model") == model and "restored" in e:
                    out.append(list(e["restored"]))
    return out


def turn(base: str, model: str, text: str) -> tuple[float, int]:
    """One turn of ``model``'s conversation, one token answered: (seconds, prompt tokens
    processed: llama-server's timings.prompt_n)."""
    t0 = time.perf_counter()
    data = http(base, "/v1/completions",
                {"model": model, "prompt": text, "max_tokens": 1, "ignore_eos": True})  # fmt: skip
    took = time.perf_counter() - t0
    timings = data.get("timings", {}) if isinstance(data, dict) else {}
    return took, int(timings.get("prompt_n", -1))


class Conversations:
    """Variant c's requests: each the next turn of its model's conversation, its model loaded
    (and, under the governor, its slot restored) first."""

    def __init__(self, base: str, arm: Arm, run_dir: Path, res: Result) -> None:
        self.base, self.arm, self.run_dir, self.res = base, arm, run_dir, res
        self.texts: dict[str, str] = {}

    def ask(self, model: str, index: int) -> float:
        before = len(restores(self.run_dir, model))
        took = load(self.base, model)
        reloaded = took is not None and model in self.texts
        if took is not None:
            self.res.loads.append((model, took))
        restored = False
        if reloaded and self.arm.governed:
            end = time.monotonic() + RESTORE_WAIT_S
            while time.monotonic() < end and len(restores(self.run_dir, model)) == before:
                time.sleep(0.1)
            done = restores(self.run_dir, model)[before:]
            restored = bool(done and done[0])
        seed = MODELS.index(model) * 1000 + index
        new = prompt(seed, NEXT_WORDS if model in self.texts else FIRST_WORDS)
        text = self.texts[model] = f"{self.texts[model]} {new}" if model in self.texts else new
        ttft, processed = turn(self.base, model, text)
        if reloaded:
            self.res.reloaded_turns.append((ttft, processed, restored))
        log(f"{self.arm.name} {model}: load {took if took is None else round(took, 1)} s, "
            f"turn {ttft:.1f} s, {processed} prompt tokens, restored {restored}")  # fmt: skip
        return (took or 0.0) + ttft


def policy_text(arm: Arm) -> str:
    return (f'name = "{NAME}"\nslice = "{SLICE}"\n[memory]\n'
            f'max = "{VARIANTS[arm.variant].memory_max}"\nswap_max = "0"\n'
            '[engine]\nkind = "llama.cpp"\nevict = "memory"\n')  # fmt: skip


def start(arm: Arm, models: Path, tmp: Path, port: int) -> tuple[subprocess.Popen[str], Path]:
    """The router, alone in a fresh cgroup with the variant's memory.max or under the governor
    (arm 4: with the evictor's LRU order, perf/governor_lru.py); its process and its group."""
    slots = None
    if VARIANTS[arm.variant].mixed:
        slots = tmp / f"slots-{arm.name}"
        slots.mkdir()
    argv = engine_argv(models, arm, port, slots)
    err = (tmp / f"{arm.name}.log").open("w")
    if arm.governed:
        policy = tmp / f"{arm.name}.toml"
        policy.write_text(policy_text(arm))
        env = {**os.environ, "GOVERNOR_RUN_DIR": str(tmp / f"run-{arm.name}"),
               "GOVERNOR_CACHE_DIR": str(tmp / "cache")}  # fmt: skip
        Path(env["GOVERNOR_RUN_DIR"]).mkdir(mode=0o755)
        entry = "perf.governor_lru" if arm.number == 4 else "governor"
        cmd = [sys.executable, "-m", entry, "launch", "--policy", str(policy), "--", *argv]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=err, stderr=err, text=True)
        return proc, CGROUP / SLICE / NAME
    group = CGROUP / SLICE / f"alone-{arm.name}"
    group.mkdir()
    (group / "memory.max").write_text(VARIANTS[arm.variant].memory_max)
    with contextlib.suppress(OSError):
        (group / "memory.swap.max").write_text("0")
    # the shell joins the group, then execs the router: its children are born in it
    join = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]
    proc = subprocess.Popen([*join, *argv], stdout=err, stderr=err, text=True)
    return proc, group


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def unloads(run_dir: Path) -> int:
    """The governor's journaled unloads ("unload a: room for b") of this launch; each one
    logged (which model gave way for which: the order the arm used)."""
    n = 0
    with contextlib.suppress(OSError):
        for line in (run_dir / NAME / "journal.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                entry = json.loads(line)
                if entry.get("source") == "unload":
                    n += 1
                    log(f"unload {entry.get('model')}: {entry.get('reason', entry.get('error'))}")
    return n


def run_arm(
    arm: Arm, models: Path, tmp: Path, requests: int, tokens: int, *, pattern: str | None = None
) -> Result:
    res = Result(arm, page_size=os.sysconf("SC_PAGE_SIZE"))
    drop_caches()
    kills0 = kernel_kills()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc, group = start(arm, models, tmp, port)
    sampler: Sampler | None = None
    try:
        wait_ready(base, proc, timeout=600)
        sampler = Sampler(group)
        sampler.start()
        refault0 = read_kv(group / "memory.stat").get("workingset_refault_file", 0)
        variant = VARIANTS[arm.variant]
        talks = Conversations(base, arm, tmp / f"run-{arm.name}", res) if variant.mixed else None
        order = (pattern or variant.pattern) if variant.mixed else variant.pattern
        for i, model in enumerate(mix(requests, order)):
            try:
                took = talks.ask(model, i) if talks else ask(base, model, i, tokens)
                res.latencies.append(took)
                log(f"{arm.name} #{i} {model}: {took:.1f} s")
            # a 500, a dropped connection, a timeout, an answer that is no JSON
            except (openai.APIError, OSError, ValueError) as err:
                res.failed += 1
                res.errors.append(f"#{i} {model}: {type(err).__name__}: {str(err)[:120]}")
                log(f"{arm.name} #{i} {model}: FAILED {res.errors[-1]}")
            time.sleep(PAUSE_S)
        stat = read_kv(group / "memory.stat")
        res.refault_file = stat.get("workingset_refault_file", 0) - refault0
        res.oom_kills = read_kv(group / "memory.events").get("oom_kill", 0)
        peak = group / "memory.peak"
        if peak.exists():
            res.peak, res.peak_source = int(peak.read_text()), "memory.peak"
        else:
            res.peak, res.peak_source = sampler.peak, "sampled memory.current"
        with contextlib.suppress(OSError):
            leaves = sorted(p.name for p in (group / "models").iterdir() if p.is_dir())
            log(f"{arm.name}: model leaves at the end: {leaves}")
        res.unloads = unloads(tmp / f"run-{arm.name}")
    finally:
        if sampler is not None:
            sampler.stop.set()
        stop(proc)
        if not arm.governed:
            kill_tree(group)
    res.wall_s = time.monotonic() - t0
    res.kernel_kills = kernel_kills() - kills0
    if arm.governed and proc.returncode not in (0, 143, -15):
        res.errors.append(f"governor exited {proc.returncode}")
        log((tmp / f"{arm.name}.log").read_text()[-2000:])
    log(f"{arm.name}: failed {res.failed}, oom_kill {res.oom_kills} (kernel log "
        f"{res.kernel_kills}), peak {(res.peak or 0) / MIB:.0f} MiB, re-read "
        f"{res.reread_mib:.0f} MiB, unloads {res.unloads}, {res.wall_s:.0f} s")  # fmt: skip
    return res


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    a = parser().parse_args(args)
    try:
        arms = parse_arms(a.arms)
    except ValueError as err:
        raise SystemExit(f"perf/router: {err} (--arms)") from err
    if a.guest:
        a.guest_timeout = a.guest_timeout or 2400.0 * a.rounds
        inner = [f"--arms={a.arms}", f"--requests={a.requests}", f"--tokens={a.tokens}",
                 f"--rounds={a.rounds}"] + ([f"--pattern={a.pattern}"] if a.pattern else [])  # fmt: skip
        return in_guest(inner, a)
    if os.geteuid() != 0 or not (CGROUP / "cgroup.controllers").exists():
        raise SystemExit("perf/router: needs root on a cgroup v2 kernel (use --guest)")
    if not SMALL.exists():
        raise SystemExit(f"perf/router: {SMALL} missing: run scripts/engine-setup")
    free = subprocess.run(["free", "-m"], capture_output=True, text=True, check=False).stdout
    log(f"kernel {os.uname().release}, {os.cpu_count()} cpus; {free.splitlines()[1]}")
    c_mix = mix(a.requests, a.pattern or VARIANTS["c"].pattern)
    print(META_TAG + json.dumps({"kernel": os.uname().release, "requests": mix(a.requests),
                                 "requests_c": c_mix}))  # fmt: skip
    if any(VARIANTS[a.variant].mixed for a in arms) and not KVGUEST.exists():
        raise SystemExit(f"perf/router: {KVGUEST} missing: run scripts/engine-setup")
    size, quick = SMALL.stat().st_size, KVGUEST.stat().st_size
    enable(CGROUP, CONTROLLERS)
    (CGROUP / SLICE).mkdir(exist_ok=True)
    enable(CGROUP / SLICE, CONTROLLERS)
    results: list[Result] = []
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as tmpd,
        tempfile.TemporaryDirectory() as mnt,
        loop_mount(Path(mnt), (4 * size + 2 * quick) // MIB + 64) as disk,
    ):
        # copies, not links: each model's own inode and page cache
        alike, mixed = disk / "models", disk / "models-c"
        alike.mkdir()
        mixed.mkdir()
        for name in MODELS:
            shutil.copyfile(SMALL, alike / f"{name}.gguf")
            shutil.copyfile(SMALL if name == "a" else KVGUEST, mixed / f"{name}.gguf")
        log(f"models: 3 copies of {SMALL.name} ({size / MIB:.0f} MiB) in {alike}; "
            f"{SMALL.name} and 2 of {KVGUEST.name} ({quick / MIB:.0f} MiB) in {mixed}")  # fmt: skip
        for rnd in range(a.rounds):
            tmp = Path(tmpd) / f"round-{rnd}"  # each round's run dirs, slots, logs
            tmp.mkdir()
            for arm in arms if rnd % 2 == 0 else reversed(arms):
                models = mixed if VARIANTS[arm.variant].mixed else alike
                res = run_arm(arm, models, tmp, a.requests, a.tokens, pattern=a.pattern)
                res.round = rnd
                results.append(res)
                print(RUN_TAG + json.dumps(to_json(res)), flush=True)
    kill_tree(CGROUP / SLICE)
    log(f"all arms: {time.monotonic() - t0:.0f} s; requests: {' '.join(mix(a.requests))}"
        f" (variant c: {' '.join(c_mix)})")  # fmt: skip
    by_count = [r for r in results if not VARIANTS[r.arm.variant].mixed]
    by_value = [r for r in results if VARIANTS[r.arm.variant].mixed]
    if by_count:
        print("\n" + table(by_count), flush=True)
    if by_value:
        print("\n" + value_table(by_value), flush=True)
    for r in results:
        for e in r.errors:
            print(f"  {r.arm.name} round {r.round}: {e}")
    meta = {"command": "python -m perf.router " + " ".join(args), "commit": commit(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    print("\n" + finish(results, meta, a.out, not a.no_plot), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
