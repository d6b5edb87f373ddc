"""bench/launch: what does `governor launch -- true` add over running `true`?

Runs, in the same process and interleaved round by round so that machine noise hits every
candidate alike:
  - `true` directly (the floor),
  - `python -c pass` with the governor's interpreter (the interpreter floor),
  - `governor launch --policy P -- true` (P: a minimal policy in a fresh tmp dir),
  - `systemd-run --scope -q true` when PID 1 is systemd (run this in the systemd guest:
    `cd tests && python -m vm.run --guest systemd -- .venv/bin/python bench/launch.py`),
  - `cgexec -g pids:<cg> true` when cgexec (cgroup-tools) is installed.
Prints the median wall time of each and the ratios. Not a test: nothing asserts on time.

    python bench/launch.py [--runs N] [--allow-missing memory,cpu,...]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICY = """name = "bench-launch"
slice = "bench.slice"
[process]
oom_score_adj = 100
"""


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


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
    """fork; the child writes itself into cgroup.procs (what the launcher does)."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fd = os.open(cg / "cgroup.procs", os.O_WRONLY)
        os.write(fd, str(os.getpid()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    return time.perf_counter() - t0


def _join_clone3(cg_fd: int, libc: ctypes.CDLL) -> float:
    """clone3(CLONE_INTO_CGROUP): the child starts inside the cgroup."""
    args = _CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=17, cgroup=cg_fd)  # SIGCHLD
    t0 = time.perf_counter()
    pid = libc.syscall(SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
    if pid == 0:
        os._exit(0)
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone3")
    os.waitpid(pid, 0)
    return time.perf_counter() - t0


def bench_join(runs: int) -> None:
    """Child creation + joining a cgroup: fork + cgroup.procs write vs clone3 into the cgroup."""
    from governor.plan.host import probe

    mount = probe().cgroup_mount
    if mount is None:
        print("  join: no cgroup2 mount, skipped")
        return
    cg = Path(mount) / f"bench-join-{os.getpid()}"
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
    print(f"  join ({runs} children, {mount}):")
    print(f"    fork, no cgroup               {base * 1000:7.2f} ms")
    fp = statistics.median(fork_t)
    print(f"    fork + write cgroup.procs     {fp * 1000:7.2f} ms  ({fp / base:.2f}x)")
    if clone_t:
        cl = statistics.median(clone_t)
        print(f"    clone3(CLONE_INTO_CGROUP)     {cl * 1000:7.2f} ms  ({cl / base:.2f}x)")


def _pid1() -> str:
    try:
        return Path("/proc/1/comm").read_text().strip()
    except OSError:
        return ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--allow-missing", default="", help="passed to governor launch")
    a = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-launch."))
    policy = tmp / "p.toml"
    policy.write_text(POLICY)
    gov = [sys.executable, "-m", "governor", "launch", "--policy", str(policy)]
    if a.allow_missing:
        gov += ["--allow-missing", a.allow_missing]
    true = shutil.which("true") or "/bin/true"
    cands: dict[str, list[str]] = {
        "true": [true],
        "python -c pass": [sys.executable, "-c", "pass"],
        "governor launch -- true": [*gov, "--", true],
    }
    if _pid1() == "systemd" and shutil.which("systemd-run"):
        cands["systemd-run --scope true"] = ["systemd-run", "--scope", "-q", true]
    if shutil.which("cgexec"):
        cands["cgexec -g pids:/ true"] = ["cgexec", "-g", "pids:/", true]
    _time(cands["governor launch -- true"])  # warm the page cache of the imports once
    times: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(a.runs):
        for name, argv in cands.items():
            times[name].append(_time(argv))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["true"]
    print(
        f"bench/launch: {a.runs} runs each, medians (host {os.uname().nodename}, PID 1 {_pid1()})"
    )
    for name, t in med.items():
        print(f"  {name:<28} {t * 1000:8.1f} ms   ({t / base:6.1f}x true)")
    added = med["governor launch -- true"] - base
    print(
        f"  governor adds {added * 1000:.1f} ms over `true`"
        f" ({(med['governor launch -- true'] - med['python -c pass']) * 1000:.1f} ms over the"
        " bare interpreter)"
    )
    if "systemd-run --scope true" in med:
        ratio = med["governor launch -- true"] / med["systemd-run --scope true"]
        print(f"  governor / systemd-run --scope = {ratio:.2f}")
    shutil.rmtree(tmp, ignore_errors=True)
    bench_join(max(a.runs * 4, 40))
    return 0


if __name__ == "__main__":
    sys.exit(main())
