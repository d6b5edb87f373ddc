"""perf/footprint: the governor's own memory while an engine runs, next to a bare interpreter
and a psutil-style watcher.

    python -m perf.footprint [--runs 5] [--settle 2] [--prefetch-mib 64] [--allow-missing auto|LIST]

Interleaved rounds of (each measured alone, `settle` seconds after its engine started, so that
the monitor has armed its PSI triggers and taken a sample):

  governor             `governor launch --policy P -- sleep S`, P = three [[pressure]] PSI rules:
                       the supervisor + its /bin/sh watchdog (the engine is not counted);
  governor, miss       the same with an empty plan cache each time (the launch compiles):
                       what stays resident for the engine's life after a first launch;
  governor + lock      P with [prefetch] mode = "lock" on a file of --prefetch-mib: supervisor +
                       watchdog again, and the prefetch helper (which stays alive, holding the
                       lock, while the engine runs) reported separately, its locked file pages
                       apart (Pss_File: that is the model, not the governor);
  python -I -S         `python -I -S -c 'import time; time.sleep(S)'`: the interpreter floor;
  psutil watcher       PEER below, the earlyoom/psutil-style peer: a 20-line launcher that puts
                       the engine in a cgroup and every second sums its processes' memory with
                       psutil (the watcher process, the engine not counted).

Memory from /proc/PID/smaps_rollup: PSS (the issue's measure), USS (Private_*, what would be
freed) and RSS. PSS splits shared file pages among every process mapping them (libpython is
shared with this bench and any other Python running), so it is read alongside USS and RSS.
Run as a user runs it: bytecode compiled, PYTHONDONTWRITEBYTECODE unset, the plan cached by a
warm-up launch. Prints the medians in MiB and the ratios. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from perf.launch import (
    POLICY,
    compile_governor,
    governor_argv,
    missing_controllers,
    user_env,
)
from perf.launch import cgroup_mount as find_cgroup_mount

REPO = Path(__file__).resolve().parents[1]

PEER = """\
import os
import sys
import time

import psutil


def main():
    root, argv = sys.argv[1], sys.argv[2:]
    cg = f"{root}/bench-peer-{os.getpid()}"
    os.mkdir(cg)
    procs = f"{cg}/cgroup.procs"
    try:
        engine = psutil.Popen(argv, preexec_fn=lambda: open(procs, "w").write("0"))
        while engine.poll() is None:
            rss = 0
            for pid in open(procs).read().split():
                try:
                    rss += psutil.Process(int(pid)).memory_info().rss
                except psutil.Error:
                    pass
            print(rss, psutil.virtual_memory().available, file=sys.stderr)
            time.sleep(1)
    finally:
        os.rmdir(cg)
    return engine.returncode


sys.exit(main())
"""

KEYS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Private_Clean", "Private_Dirty")
MiB = 1 << 20


def rollup(pid: int) -> dict[str, int]:
    """Bytes of /proc/PID/smaps_rollup's fields in KEYS (+ Uss)."""
    out = dict.fromkeys(KEYS, 0)
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in out:
                out[key] = int(rest.split()[0]) * 1024
    out["Uss"] = out["Private_Clean"] + out["Private_Dirty"]
    return out


def children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


def descendants(pid: int) -> Iterator[int]:
    for kid in children(pid):
        yield kid
        yield from descendants(kid)


def exe(pid: int) -> str:
    try:
        return os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return ""


def add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in a.keys() | b.keys()}


def mapped_pss(pid: int, path: str) -> int:
    """Bytes of PSS in the mappings of ``path`` (/proc/PID/smaps)."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(maxsplit=5)
            if "-" in first[0] and len(first) >= 5 and not first[0].endswith(":"):
                inside = len(first) == 6 and first[5].strip() == path
            elif inside and first[0] == "Pss:":
                total += int(first[1]) * 1024
    return total


def measure(
    argv: list[str],
    env: dict[str, str],
    *,
    engine_exe: str,
    settle: float,
    model: str,
    log: Path,
    timeout: float = 30,
) -> dict[str, dict[str, int]]:
    """Start argv, wait until its engine (a descendant running engine_exe) has run `settle` s,
    sum smaps_rollup by role: "self" (argv's process and its other descendants: the
    watchdog), "helper" (descendants running the interpreter; "Model": its PSS in ``model``'s
    mappings), "engine"."""
    with log.open("wb") as err:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
        )
    py = os.path.realpath(sys.executable)
    try:
        deadline = time.monotonic() + timeout
        while not any(exe(d) == engine_exe for d in descendants(proc.pid)):
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"perf/footprint: no engine under {argv}\n{text}")
            time.sleep(0.01)
        time.sleep(settle)
        roles: dict[str, dict[str, int]] = {"self": rollup(proc.pid)}
        roles["supervisor"] = dict(roles["self"])
        for pid in descendants(proc.pid):
            path = exe(pid)
            role = "engine" if path == engine_exe else "helper" if path == py else "self"
            try:
                sample = rollup(pid)
                if role == "helper":
                    sample["Model"] = mapped_pss(pid, model)
            except OSError:
                continue  # gone meanwhile
            roles[role] = add(roles.get(role, {}), sample)
        return roles
    finally:
        proc.wait(timeout=timeout)


def mib(x: float) -> str:
    return f"{x / MiB:6.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--settle", type=float, default=2.0, help="seconds after the engine starts")
    p.add_argument("--prefetch-mib", type=int, default=64, help="size of the locked file")
    p.add_argument("--allow-missing", default="auto")
    a = p.parse_args()

    env = user_env()
    compile_governor(env)
    mount = find_cgroup_mount()
    allow = missing_controllers(mount) if a.allow_missing == "auto" else a.allow_missing
    sleep = shutil.which("sleep") or "/bin/sleep"
    sleep_exe = os.path.realpath(sleep)
    hold = f"{a.settle + 1.5:g}"
    tmp = Path(tempfile.mkdtemp(prefix="bench-footprint."))
    env["GOVERNOR_CACHE_DIR"] = str(tmp / "cache")
    try:
        model = tmp / "model.bin"
        with model.open("wb") as f:
            f.write(os.urandom(MiB) * a.prefetch_mib)
        plain = tmp / "plain.toml"
        plain.write_text(POLICY)
        lock = tmp / "lock.toml"
        lock.write_text(POLICY + f'[prefetch]\nmode = "lock"\nfiles = ["{model}"]\n')
        log = tmp / "stderr.log"
        peer = tmp / "peer.py"
        peer.write_text(PEER)
        extra = ["--allow-missing", allow] if allow else []
        cands: dict[str, tuple[list[str], str]] = {
            "governor": ([*governor_argv(), "launch", "--policy", str(plain), *extra, "--", sleep, hold], sleep_exe),
            "governor, plan cache miss": ([*governor_argv(), "launch", "--policy", str(plain), *extra, "--", sleep, hold], sleep_exe),
            "governor + prefetch lock": ([*governor_argv(), "launch", "--policy", str(lock), *extra, "--", sleep, hold], sleep_exe),
            "python -I -S (floor)": ([sys.executable, "-I", "-S", "-c", f"import time; time.sleep({hold})"], ""),
            "psutil watcher (peer)": ([sys.executable, str(peer), str(mount), sleep, hold], sleep_exe),
        }  # fmt: skip
        print(f"perf/footprint on {os.uname().nodename}: kernel {os.uname().release},"
              f" PID 1 {Path('/proc/1/comm').read_text().strip()}, load {os.getloadavg()[0]:.2f}")  # fmt: skip
        print(f"  python {sys.executable}; cgroup2 {mount}; --allow-missing {allow or '(none)'}")
        print(
            f"  {a.runs} rounds, measured {a.settle:g} s after the engine started; locked file {a.prefetch_mib} MiB"
        )
        for argv, _ in cands.values():  # warm-up: page cache, plan cache (same argv: its key)
            subprocess.run(argv, env=env, check=True, capture_output=True)
        samples: dict[str, list[dict[str, dict[str, int]]]] = {k: [] for k in cands}
        for n in range(a.runs):
            for name, (argv, engine) in cands.items():
                run_env = env
                if name == "governor, plan cache miss":  # a cache of its own, empty
                    run_env = {**env, "GOVERNOR_CACHE_DIR": str(tmp / f"miss-{n}")}
                samples[name].append(
                    measure(
                        argv, run_env, engine_exe=engine, settle=a.settle, model=str(model), log=log
                    )
                    if engine
                    else measure_alone(argv, env, settle=a.settle)
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(name: str, role: str, key: str) -> float:
        return statistics.median(s.get(role, {}).get(key, 0) for s in samples[name])

    print(f"\nmedians, MiB ({'; '.join(('PSS', 'USS', 'RSS', 'Pss_Anon', 'Pss_File'))})")
    rows = [
        ("governor: supervisor + watchdog", "governor", "self"),
        ("governor: supervisor alone", "governor", "supervisor"),
        ("miss: supervisor + watchdog", "governor, plan cache miss", "self"),
        ("miss: supervisor alone", "governor, plan cache miss", "supervisor"),
        ("governor + lock: supervisor + watchdog", "governor + prefetch lock", "self"),
        ("governor + lock: prefetch helper", "governor + prefetch lock", "helper"),
        ("python -I -S (interpreter floor)", "python -I -S (floor)", "self"),
        ("psutil watcher (peer)", "psutil watcher (peer)", "self"),
    ]
    print(f"  {'':40} {'PSS':>6} {'USS':>6} {'RSS':>6} {'anon':>6} {'file':>6}")
    for label, name, role in rows:
        vals = [med(name, role, k) for k in ("Pss", "Uss", "Rss", "Pss_Anon", "Pss_File")]
        print(f"  {label:40} " + " ".join(mib(v) for v in vals))
    g = med("governor", "self", "Pss")
    floor = med("python -I -S (floor)", "self", "Pss")
    peer_pss = med("psutil watcher (peer)", "self", "Pss")
    helper = med("governor + prefetch lock", "helper", "Pss")
    helper_own = helper - med("governor + prefetch lock", "helper", "Model")
    print("\nratios (goal):")
    print(f"  governor PSS                     {g / MiB:6.2f} MiB  (<= 12 MiB)")
    miss = med("governor, plan cache miss", "self", "Pss")
    print(f"  governor PSS after a miss        {miss / MiB:6.2f} MiB  (<= 12 MiB)")
    print(f"  governor / python -I -S, PSS     {g / floor:6.2f}")
    print(f"  governor / psutil watcher, PSS   {g / peer_pss:6.2f}")
    print(
        f"  prefetch helper PSS {helper / MiB:.2f} MiB, without the locked file's pages {helper_own / MiB:.2f} MiB"
    )
    lock_total = med("governor + prefetch lock", "self", "Pss") + helper_own
    print(f"  governor + lock, all its own (locked file apart) {lock_total / MiB:6.2f} MiB")
    return 0


def measure_alone(
    argv: list[str], env: dict[str, str], *, settle: float
) -> dict[str, dict[str, int]]:
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        time.sleep(settle)
        return {"self": rollup(proc.pid)}
    finally:
        proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
