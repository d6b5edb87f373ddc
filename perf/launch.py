"""perf/launch: what `governor launch -- true` costs over the same kernel work done by hand.

    python -m perf.launch [--runs N] [--allow-missing auto|LIST] [--no-join] [--baseline DIR]

One interleaved run (every round runs every candidate once, in a shuffled order, so machine
noise hits them alike) of:

  floor            FLOOR below, a 25-line Python launcher doing the governor's kernel work for
                   `true`: mkdir a cgroup, fork, the child writes itself into cgroup.procs and
                   execs, wait, rmdir; with the governor's interpreter (site included: the venv);
  floor -I -S      the same without site and environment (the interpreter alone);
  governor         `governor launch --policy P -- true`, P = three [[pressure]] PSI rules; run
                   the way a user runs it: the console script, bytecode compiled (this script
                   runs compileall and unsets PYTHONDONTWRITEBYTECODE for its children), the
                   plan cached by one warm-up launch;
  systemd-run      `systemd-run --scope -q true` when PID 1 is systemd (the peer; run this in
                   the systemd guest: `cd tests && python -m vm.run --guest systemd -- ...`),
                   next to `governor launch --backend systemd` there;
  exec             the engine exec'd directly (the zero line);
  baseline         with --baseline DIR: `governor launch` of another checkout (e.g. main via
                   `git archive`), in the same rounds (before/after from one run).

Per candidate: the median wall time from spawn to reaped, the CPU time (user + sys of the
whole tree, wait4) and, in separate runs, the time-to-exec: from the spawn until the engine
runs. The engine of those runs is STAMP, a tiny C program printing CLOCK_MONOTONIC (`date
+%s.%N` against the realtime clock when there is no C compiler), so the time-to-exec includes
its own start, alike for every candidate. Ratios are to the floor. Not a test: nothing here
asserts on time. Also times joining a cgroup (fork + cgroup.procs vs clone3) unless --no-join.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# three PSI rules: the monitor arms one trigger per rule (memory, cpu, io pressure files)
POLICY = """\
name = "bench-launch"
slice = "bench.slice"
[process]
on_governor_exit = "kill"
[[pressure]]
when = "memory some 150ms/2s"
do = ["log"]
cooldown = "10s"
[[pressure]]
when = "cpu some 500ms/2s"
do = ["log"]
cooldown = "10s"
[[pressure]]
when = "io full 500ms/2s"
do = ["log"]
cooldown = "10s"
"""

FLOOR = """\
import os
import sys


def main():
    root, argv = sys.argv[1], sys.argv[2:]
    cg = f"{root}/bench-floor-{os.getpid()}"
    os.mkdir(cg)
    try:
        pid = os.fork()
        if pid == 0:
            try:
                fd = os.open(cg + "/cgroup.procs", os.O_WRONLY)
                os.write(fd, b"0")
                os.close(fd)
                os.execv(argv[0], argv)
            finally:
                os._exit(127)
        _, status = os.waitpid(pid, 0)
    finally:
        os.rmdir(cg)
    return os.waitstatus_to_exitcode(status)


sys.exit(main())
"""

STAMP_C = """\
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    printf("%lld.%09ld\\n", (long long)t.tv_sec, t.tv_nsec);
    return 0;
}
"""

CONTROLLERS = ("memory", "cpu", "cpuset", "io", "pids")


class Failed(Exception):
    pass


def spawn(
    argv: Sequence[str], env: dict[str, str], *, capture: bool = False
) -> tuple[float, float, str]:
    """(wall seconds from spawn to reaped, CPU seconds of the tree, stdout if captured).
    posix_spawn (vfork) + wait4: the bench's own cost is small and alike for everyone."""
    actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
    ]
    r = w = -1
    if capture:
        r, w = os.pipe()  # close-on-exec; the dup2 onto 1 is inherited
        actions.append((os.POSIX_SPAWN_DUP2, w, 1))
    else:
        actions.append((os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0))
    t0 = time.monotonic()
    pid = os.posix_spawn(argv[0], list(argv), env, file_actions=actions)
    out = b""
    if capture:
        os.close(w)
        with os.fdopen(r, "rb") as f:
            out = f.read()
    _, status, ru = os.wait4(pid, 0)
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise Failed(f"exit status {os.waitstatus_to_exitcode(status)}: {' '.join(argv)}")
    return wall, ru.ru_utime + ru.ru_stime, out.decode(errors="replace")


def explain_failure(argv: Sequence[str], env: dict[str, str]) -> str:
    p = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    return (p.stderr or p.stdout)[-3000:]


def make_stamp(tmp: Path) -> tuple[list[str], Callable[[], float]]:
    """The time-to-exec engine and the parent clock it compares with."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        src, exe = tmp / "stamp.c", tmp / "stamp"
        src.write_text(STAMP_C)
        for static in (["-static"], []):
            r = subprocess.run(
                [cc, "-O2", *static, "-o", str(exe), str(src)], capture_output=True, check=False
            )
            if r.returncode == 0:
                return [str(exe)], time.monotonic
    date = shutil.which("date") or "/bin/date"
    return [date, "+%s.%N"], time.time


def cgroup_mount() -> Path:
    from governor.plan.host import probe

    mount = probe().cgroup_mount
    if mount is None:
        raise SystemExit("perf/launch: no cgroup2 mount")
    return Path(mount)


def missing_controllers(mount: Path) -> str:
    try:
        have = set((mount / "cgroup.controllers").read_text().split())
    except OSError:
        have = set()
    return ",".join(c for c in CONTROLLERS if c not in have)


def _pid1() -> str:
    try:
        return Path("/proc/1/comm").read_text().strip()
    except OSError:
        return ""


def user_env() -> dict[str, str]:
    """The environment users run with: bytecode is written and read. The governor measured
    is this checkout's (first on PYTHONPATH, ahead of an editable install elsewhere)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])
    return env


def governor_argv() -> list[str]:
    """The console script next to this interpreter (what `governor` runs), else -m."""
    script = Path(sys.executable).parent / "governor"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "governor"]


def compile_governor(env: dict[str, str]) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("governor")
    if spec is None or spec.origin is None:
        raise SystemExit("perf/launch: governor is not importable")
    pkg = Path(spec.origin).parent
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(pkg)], env=env, check=True)
    return pkg


def summarize(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return f"{statistics.median(xs) * 1000:8.2f} ms [{q[0] * 1000:.1f}-{q[2] * 1000:.1f}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=20, help="rounds (each runs every candidate)")
    p.add_argument(
        "--allow-missing",
        default="auto",
        help="passed to governor launch; auto: the controllers the cgroup2 mount lacks",
    )
    p.add_argument("--no-join", action="store_true", help="skip the join micro-benchmark")
    p.add_argument("--seed", type=int, default=17)
    p.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. `git archive main`) run as a candidate in the same rounds:"
        " before/after from one interleaved run",
    )
    a = p.parse_args()

    env = user_env()
    pkg = compile_governor(env)
    mount = cgroup_mount()
    allow = missing_controllers(mount) if a.allow_missing == "auto" else a.allow_missing
    tmp = Path(tempfile.mkdtemp(prefix="bench-launch."))
    env["GOVERNOR_CACHE_DIR"] = str(tmp / "cache")  # a plan cache of our own, warmed below
    try:
        return _run(a, env, pkg=pkg, mount=mount, allow=allow, tmp=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not a.no_join:
            bench_join(mount, max(a.runs * 4, 40))


def _run(
    a: argparse.Namespace, env: dict[str, str], *, pkg: Path, mount: Path, allow: str, tmp: Path
) -> int:
    policy = tmp / "p.toml"
    policy.write_text(POLICY)
    floor = tmp / "floor.py"
    floor.write_text(FLOOR)
    stamp, clock = make_stamp(tmp)
    gov = [*governor_argv(), "launch", "--policy", str(policy)]
    if allow:
        gov += ["--allow-missing", allow]
    true = shutil.which("true") or "/bin/true"
    # name -> argv prefix; the engine's argv is appended
    envs: dict[str, dict[str, str]] = {}
    cands: dict[str, list[str]] = {
        "exec (no launcher)": [],
        "floor": [sys.executable, str(floor), str(mount)],
        "floor -I -S": [sys.executable, "-I", "-S", str(floor), str(mount)],
        "governor launch": [*gov, "--"],
    }
    if a.baseline is not None:
        base = a.baseline.resolve()
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(base / "governor")], check=True
        )
        cands["baseline launch"] = [*gov, "--"]
        envs["baseline launch"] = {
            **env,
            "PYTHONPATH": os.pathsep.join([str(base), env["PYTHONPATH"]]),
            "GOVERNOR_CACHE_DIR": str(tmp / "baseline-cache"),
        }
    systemd = _pid1() == "systemd" and shutil.which("systemd-run")
    if systemd:
        cands["governor launch --backend systemd"] = [*gov, "--backend", "systemd", "--"]
        cands["systemd-run --scope"] = [
            shutil.which("systemd-run") or "systemd-run",
            "--scope",
            "-q",
        ]

    probe = subprocess.run(
        [sys.executable, "-c", "import governor; print(governor.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    print(f"perf/launch on {os.uname().nodename}: kernel {os.uname().release}, PID 1 {_pid1()},"
          f" {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"  python {sys.executable} ({sys.version.split()[0]}); governor {probe}")
    print(f"  bytecode compiled in {pkg}, PYTHONDONTWRITEBYTECODE unset for the candidates")
    print(f"  cgroup2 {mount}; --allow-missing {allow or '(none)'}; governor argv: {' '.join(gov)}")
    print(f"  time-to-exec engine: {' '.join(stamp)} ({clock.__name__} clock)")

    for name, pre in cands.items():  # warm-up: page cache, plan cache, systemd's first scope
        for engine in ([true], stamp):
            try:
                spawn(
                    [*pre, *engine] if pre else engine,
                    envs.get(name, env),
                    capture=engine is stamp,
                )
            except Failed as err:
                print(f"  {name}: {err}\n{explain_failure([*pre, *engine], env)}")
                return 1

    wall: dict[str, list[float]] = {k: [] for k in cands}
    cpu: dict[str, list[float]] = {k: [] for k in cands}
    tte: dict[str, list[float]] = {k: [] for k in cands}
    after: dict[str, list[float]] = {k: [] for k in cands}
    rng = random.Random(a.seed)
    order = list(cands)
    for _ in range(a.runs):
        rng.shuffle(order)
        for name in order:
            pre = cands[name]
            w, c, _ = spawn([*pre, true] if pre else [true], envs.get(name, env))
            wall[name].append(w)
            cpu[name].append(c)
        rng.shuffle(order)
        for name in order:
            pre = cands[name]
            t0 = clock()
            w, _, out = spawn([*pre, *stamp] if pre else stamp, envs.get(name, env), capture=True)
            t_exec = float(out.split()[-1]) - t0
            tte[name].append(t_exec)
            after[name].append(w - t_exec)

    def med(d: dict[str, list[float]], k: str) -> float:
        return statistics.median(d[k])

    print(f"\n{a.runs} rounds, medians [quartiles]; ratio = / floor (same interpreter, with site)")
    print(f"  {'candidate':36} {'wall, -- true':>26} {'x':>6} {'CPU':>9} {'x':>6}"
          f" {'time-to-exec':>26} {'x':>6} {'exec->reaped':>12}")  # fmt: skip
    for name in cands:
        print(
            f"  {name:36} {summarize(wall[name]):>26} {med(wall, name) / med(wall, 'floor'):6.2f}"
            f" {med(cpu, name) * 1000:6.1f} ms {med(cpu, name) / med(cpu, 'floor'):6.2f}"
            f" {summarize(tte[name]):>26} {med(tte, name) / med(tte, 'floor'):6.2f}"
            f" {med(after, name) * 1000:9.2f} ms"
        )
    g = "governor launch"
    print("\nratios (goal):")
    print(f"  governor / floor, wall           {med(wall, g) / med(wall, 'floor'):5.2f}")
    print(
        f"  governor / floor -I -S, wall     {med(wall, g) / med(wall, 'floor -I -S'):5.2f}  (<= 3)"
    )
    if "baseline launch" in cands:
        b = "baseline launch"
        print(f"  baseline / floor -I -S, wall     {med(wall, b) / med(wall, 'floor -I -S'):5.2f}")
        print(f"  governor / baseline, wall        {med(wall, g) / med(wall, b):5.2f}")
        print(f"  governor / baseline, CPU         {med(cpu, g) / med(cpu, b):5.2f}")
    print(f"  governor / floor, time-to-exec   {med(tte, g) / med(tte, 'floor'):5.2f}")
    print(f"  governor / floor, CPU            {med(cpu, g) / med(cpu, 'floor'):5.2f}")
    if systemd:
        s, gs = "systemd-run --scope", "governor launch --backend systemd"
        for name in (g, gs):
            print(
                f"  {name} / systemd-run --scope, wall {med(wall, name) / med(wall, s):5.2f}  (<= 1.5)"
            )
            print(
                f"  {name} / systemd-run --scope, time-to-exec {med(tte, name) / med(tte, s):5.2f}"
            )
        # what any Python launcher starts from here: the interpreter against a C peer
        print(f"  floor / systemd-run --scope, wall {med(wall, 'floor') / med(wall, s):5.2f}")
        print(
            f"  floor -I -S / systemd-run --scope, wall {med(wall, 'floor -I -S') / med(wall, s):5.2f}"
        )
    return 0


# ------------------------------------------------------------------ joining a cgroup

# clone3(2): syscall 435 on x86_64 and arm64; CLONE_INTO_CGROUP since 5.7
SYS_CLONE3 = 435
CLONE_INTO_CGROUP = 0x200000000


class _CloneArgs(ctypes.Structure):
    _fields_ = [  # ctypes wants a plain list here
        (name, ctypes.c_uint64)
        for name in (
            "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack",
            "stack_size", "tls", "set_tid", "set_tid_size", "cgroup",
        )
    ]  # fmt: skip


def _join_fork_procs(cg: Path) -> float:
    """fork; the child writes itself into cgroup.procs (what the floor does)."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fd = os.open(cg / "cgroup.procs", os.O_WRONLY)
        os.write(fd, str(os.getpid()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    return time.perf_counter() - t0


def _join_clone3(cg_fd: int, libc: ctypes.CDLL) -> float:
    """clone3(CLONE_INTO_CGROUP): the child starts inside the cgroup (what the governor does)."""
    args = _CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=17, cgroup=cg_fd)  # SIGCHLD
    t0 = time.perf_counter()
    pid = libc.syscall(SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
    if pid == 0:
        os._exit(0)
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone3")
    os.waitpid(pid, 0)
    return time.perf_counter() - t0


def bench_join(mount: Path, runs: int) -> None:
    """Child creation + joining a cgroup: fork + cgroup.procs write vs clone3 into the cgroup."""
    cg = mount / f"bench-join-{os.getpid()}"
    cg.mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(cg, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fork_t = [_join_fork_procs(cg) for _ in range(runs)]
        plain_t = []
        for _ in range(runs):
            t0 = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            plain_t.append(time.perf_counter() - t0)
        try:
            clone_t = [_join_clone3(fd, libc) for _ in range(runs)]
        except OSError as err:
            print(f"  join: clone3(CLONE_INTO_CGROUP) unavailable: {err}")
            clone_t = []
    finally:
        os.close(fd)
        cg.rmdir()
    base = statistics.median(plain_t)
    print(f"\njoin ({runs} children, {mount}), medians:")
    print(f"  fork, no cgroup               {base * 1000:7.2f} ms")
    fp = statistics.median(fork_t)
    print(f"  fork + write cgroup.procs     {fp * 1000:7.2f} ms  ({fp / base:.2f}x)")
    if clone_t:
        cl = statistics.median(clone_t)
        print(f"  clone3(CLONE_INTO_CGROUP)     {cl * 1000:7.2f} ms  ({cl / base:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
