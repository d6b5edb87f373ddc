"""The project's test runner: lint, host tier, and one qemu guest boot per real-kernel tier.

Run through scripts/test (which runs scripts/setup and activates .venv first)::

    scripts/test                         # lint, host, kernel, systemd, compat-5.10, compat-6.18
    scripts/test --kernel 5.10           # kernel and systemd tiers on Debian's 5.10 kernel
    scripts/test --host-only             # lint, host
    scripts/test --tier kernel,systemd   # only the guest tiers
    scripts/test --tier kernel -k oom    # extra arguments go to every pytest run

Tiers
  lint     ruff check, ruff format --check, mypy (config in pyproject.toml), mkdocs build --strict
  host     pytest -m "not kernel and not systemd and not engine" on the host
  kernel   ONE qemu boot of the host kernel (busybox initramfs, host root over 9p with
           cache=loose under a tmpfs overlay, bash as PID 1, no systemd); inside, pytest -m
           kernel tests/kernel (cgroup2 at /sys/fs/cgroup with all controllers, root, PSI);
           --kernel-vm vng boots virtme-ng instead (same kernel; about 2.7x slower: its 9p
           root is uncached, so every Python import walks the host over 9p)
  systemd  ONE hand-made qemu boot with systemd as PID 1 (busybox initramfs, host root over 9p
           under a tmpfs overlay); inside, pytest -m systemd tests/systemd runs as a
           Type=oneshot Delegate=yes service
  compat-S the kernel tier's boot on Debian's kernel of series S (any of KERNEL_SERIES, fetched
           and cached by scripts/kernels), running only the tests marked `compat` (launch, OOM
           group kill, the watchdog, each pressure action, prefetch, shed, doctor); the default
           run has those of COMPAT_KERNELS (5.10, 6.18), the others are opt-in
  quadlet  ONE boot of Debian 13's own root file system (mmdebstrap, cached; tests/vm/quadlet.py)
           on its 6.12 kernel with systemd as PID 1 and podman's Quadlet generator kept;
           inside, pytest -m quadlet tests/quadlet (opt-in: --tier quadlet)

Before a guest boots, the repo's Python files are compiled to bytecode on the host
(compileall into their __pycache__ directories, which git ignores): the guests run with
PYTHONDONTWRITEBYTECODE=1 and would otherwise compile governor/ from source, under TCG, in every
Python process a test starts.

Results (junit xml, guest console logs, pytest output) go to out/test-results/<stamp>/<tier>/,
which the guests share read-write. A tier fails when pytest fails, collects no tests (exit 5),
when a guest does not boot or return an exit code before the tier's timeout, or, with CI=true,
when a test was skipped for a reason not on the allow list in tests/vm/skips.py.

Time: every tier has a timeout (TIER_TIMEOUTS, sized from measured durations; --timeout sets
one for all), every test a pytest-timeout, and the whole run one deadline (--deadline, default
DEADLINE_S from the start of scripts/setup): a tier is cut at the deadline (the guests stop
their pytest with SIGINT before the host kills qemu, so the junit xml of what ran survives), a
tier that can no longer start is not started and fails with a note, and the summary table and
the duration report (durations.txt: wall time per phase and tier, the slowest 15 tests of each
tier) are printed in every case. A default run also holds each tier to its budget
(TIER_BUDGETS, measured walls with margin, well under the timeouts): with CI=true a tier that
passes it fails, so a slow test is seen in the run that adds it; each guest test's own budget
(tests/vm/budgets.py) lists it in the report when it passes that, without failing the tier.
--full selects the tests marked `full` (the seed's full scale), which default runs deselect,
with FULL_* timeouts.

Environment: GOVERNOR_VM_ACCEL=auto|kvm|tcg, GOVERNOR_VM_KERNEL=/boot/vmlinuz-...,
GOVERNOR_VM_TIMEOUT=seconds, GOVERNOR_TEST_DEADLINE=seconds, GOVERNOR_TEST_FULL=1,
GOVERNOR_TEST_STARTED (epoch seconds; scripts/test sets it before setup), GOVERNOR_KERNEL_VM=
qemu|vng, CI (exported to the guests; CI=true turns missing-requirement skips into failures and
fails a tier on a skip not on the allow list).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import IO

from vm import budgets, initramfs
from vm.junit import (
    Case,
    Counts,
    TierResult,
    format_durations,
    format_table,
    judge_budget,
    judge_pytest,
)
from vm.skips import is_ci

ROOT = Path(__file__).resolve().parents[2]
# Debian's kernel series of the matrix (scripts/kernels fetches and caches them): --kernel
# boots the kernel and systemd tiers on one of them; a compat tier runs the tests marked
# `compat` (tests/kernel) on one of them. The default run (CI) has the compat tiers of
# COMPAT_KERNELS: the vendor BSP's base (5.10) and the mainline LTS of RK3588 boards without the
# vendor NPU driver (6.18, issue 47); 6.1 is the kernel tier's own (/boot). Debian 13's 6.12,
# 6.1 and Armbian edge's 7.x are opt-in (`--tier compat-6.12,compat-7.x`, results in
# docs/boards.md). Under multi-threaded TCG, 6.18
# died of "Oops: int3" where the kernel patches its own code live (a static key's int3 seen by
# another vCPU): once in sched_clock_idle_wakeup_event at boot (tsc=unstable below avoids that
# one), once in get_page_from_freelist at 114 s of the compat tier (2026-12-05, with the flag).
# Under single-threaded TCG (TCG_THREADS) its compat runs had no oops; the restart test's
# failure was 6.18.15 killing a CLONE_INTO_CGROUP child in a leaf cgroup.kill had reached
# (governor/launch/launcher.py start); the tier took 486 s (busy machine) and 270 s (quiet),
# both 2026-12-06, against 6.12's 162-296
KERNEL_SERIES: tuple[str, ...] = ("5.10", "6.1", "6.12", "6.18", "7.x")
COMPAT_KERNELS: tuple[str, ...] = ("5.10", "6.18")
# the series `--arch arm64` boots (tests/vm/arm64.py): bookworm's 6.1, the default, and
# trixie-backports' 6.18 (issue 47)
ARM64_KERNELS: tuple[str, ...] = ("6.1", "6.18")
# Kernel arguments a series gets under TCG. `tsc=unstable`: the series' sched_clock stays
# unstable from the start, so sched_clock_init_late (a late_initcall) never flips the
# __sched_clock_stable static key. That flip patches a branch in the idle loop
# (sched_clock_idle_wakeup_event) with int3 while the other vCPUs run it, and under
# multi-threaded TCG an idle vCPU once executed the int3 after the patch was done: "Oops: int3"
# at 3.3 s, one boot of two on 6.18 (issue 47). The clocksource is then the HPET (the
# guest's clock_gettime is a syscall), no other change
TCG_BOOT_ARGS: dict[str, str] = {"6.18": "tsc=unstable", "7.x": "tsc=unstable"}
# The TCG threading a series gets (else "multi": one host thread per vCPU). 6.18 and 7.x run
# all their vCPUs round-robin on one host thread: with tsc=unstable alone, a compat-6.18 run
# still died of "Oops: int3" in get_page_from_freelist at 114 s (2026-12-05): another static
# key patched live (text_poke_bp) while a vCPU on another host thread ran a stale translation
# holding the breakpoint after the patch was done. With one thread no vCPU runs while another
# patches (issue 47)
TCG_THREADS: dict[str, str] = {"6.18": "single", "7.x": "single"}
# --overlap runs every compat tier this way, for time: on the 2-core CI machine a one-thread
# guest leaves the other core to lint and the host tier (issue 47 item 3)
OVERLAP_THREAD = "single"
COMPAT_MARK = "compat"
COMPAT_TIERS: tuple[str, ...] = tuple(f"compat-{k}" for k in KERNEL_SERIES)
# the quadlet tier (tests/vm/quadlet.py): Debian 13's own root file system and kernel, systemd
# as PID 1, podman's Quadlet generator reading `governor render quadlet`'s file (issue 48)
QUADLET_TIER = "quadlet"
TIERS: tuple[str, ...] = ("lint", "host", "kernel", "systemd", *COMPAT_TIERS, QUADLET_TIER)
DEFAULT_COMPAT_TIERS: tuple[str, ...] = tuple(f"compat-{k}" for k in COMPAT_KERNELS)
DEFAULT_TIERS: tuple[str, ...] = ("lint", "host", "kernel", "systemd", *DEFAULT_COMPAT_TIERS)
GUEST_TIERS: tuple[str, ...] = ("kernel", "systemd", *COMPAT_TIERS, QUADLET_TIER)
HOST_MARKEXPR = "not kernel and not systemd and not engine and not quadlet"
# tests marked `full` run at the seed's full scale (1.1 GiB model, 2 GiB board): only --full
FULL_MARK = "full"
# The whole run, setup included, ends by this many seconds after scripts/test started (CI's
# limit is 90 min; the target is 45)
DEADLINE_S = 80 * 60
FULL_DEADLINE_S = 150 * 60
# Per tier, seconds; a tier is stopped after it. Sized from measured wall times on the 2-core
# CI machine with margin: lint 4 s (10 s with a cold mypy cache), host 105 s (150 s beside a
# build), kernel ~25 min and systemd ~15 min before issue 21 (durations.txt of each run has
# the current numbers; kernel 3000 -> 3400 s as this wave added ~300 s of guest tests); a compat
# tier's limit leaves a hung test its own 900 s
TIER_TIMEOUTS: dict[str, float] = {
    "lint": 300, "host": 600, "kernel": 3400, "systemd": 1800,
    **dict.fromkeys(COMPAT_TIERS, 1500), QUADLET_TIER: 1500,
}  # fmt: skip
FULL_TIER_TIMEOUTS: dict[str, float] = {
    **TIER_TIMEOUTS, "kernel": 4200, "systemd": 3000, **dict.fromkeys(COMPAT_TIERS, 3000),
    QUADLET_TIER: 3000,
}  # fmt: skip
# Per tier, seconds of wall time a default run (amd64, the harness's qemu, one tier after the
# other, no --full, no --kernel) may take: under CI=true a tier that takes longer fails, well
# before its timeout starts cutting tests, so a slow test is seen in the run that adds it.
# From the 2-core CI machine's measured walls (docs/development.md "What each tier costs"),
# with ~25-30% margin for a busy machine: lint 13-23 s, host 223-311 s, kernel 1506 s on a
# clean clone before wave 5, 2300 s (cut) at stop 42's CI, 2156 s on a clean clone at 56fac43
# (94 tests: the wave's trims and its new guest tests), systemd 313-443 s (644 s beside a host
# test run), compat 162-437 s; compat-6.18 under single-threaded TCG 486 and 270 s
# Kernel 2700 -> 2550 (issue 47 item 3): the cut tests took 166-290 s less in one guest run
# (20261206-051258: a machine 1.5-1.9x slower than the CI run, by the unchanged tests in it),
# so ~2000-2120 s expected on the CI machine; ~20 % margin for a busy one and the wave's tests.
# Host 420 -> 480: 405 s on a clean clone of 8d75660 (2570 tests, 390 s of them in pytest's
# own times), 4 % under 420; 355 s at 8e5d406 (2512).
TIER_BUDGETS: dict[str, float] = {
    "lint": 60, "host": 480, "kernel": 2550, "systemd": 600,
    **dict.fromkeys(COMPAT_TIERS, 570), "compat-6.18": 630, QUADLET_TIER: 600,
}  # fmt: skip
# a tier with less time than this left before the deadline is not started
MIN_START_S: dict[str, float] = {
    "lint": 30, "host": 60, "kernel": 300, "systemd": 300, **dict.fromkeys(COMPAT_TIERS, 240),
    QUADLET_TIER: 300,
}  # fmt: skip
# of a guest tier's timeout, what the boot before pytest and the power-off after may take: the
# guest's pytest gets the rest (timeout -s INT), so it ends and writes its junit xml before the
# host kills qemu
GUEST_OVERHEAD_S = 120
# seconds for the host to wait after SIGINT (pytest writes its junit xml) before SIGTERM/KILL
INTERRUPT_GRACE_S = 20.0
# per test (pytest-timeout): a hung test fails alone instead of eating the tier's timeout
HOST_TEST_TIMEOUT_S = 300
GUEST_TEST_TIMEOUT_S = 900
FULL_GUEST_TEST_TIMEOUT_S = 1800  # the 1.1 GiB model test took 723 s at the last full run
GUEST_CPUS = 4
GUEST_MEMORY_MIB = 2048
FULL_GUEST_MEMORY_MIB = 2048  # the seed's 2 GiB board
# environment variables handed to the guest command (when set on the host)
PASS_ENV: tuple[str, ...] = (
    "CI", "LANG", "LC_ALL", "TERM", "PYTEST_ADDOPTS", "HYPOTHESIS_PROFILE", "NO_COLOR",
    "FORCE_COLOR",
)  # fmt: skip
PASS_ENV_PREFIXES: tuple[str, ...] = ("GOVERNOR_",)
# the repo's Python trees compiled on the host before a guest boots (precompile); the venv's
# site-packages and the interpreter's stdlib come with their bytecode already
BYTECODE_DIRS: tuple[str, ...] = ("governor", "tests")
# pytest plugins the guests do without: the cache (the tree is read-only there) and
# hypothesis's plugin, which imports all of hypothesis (~25 s of the guest's pytest start under
# TCG; no guest test uses hypothesis)
GUEST_PYTEST_OFF: tuple[str, ...] = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
# units that stall under TCG or that would wipe/replace the shared host /tmp
SYSTEMD_MASKS: tuple[str, ...] = (
    "systemd-udev-trigger.service", "apparmor.service", "systemd-timesyncd.service",
    "systemd-pstore.service", "e2scrub_reap.service", "systemd-journal-flush.service",
    "systemd-random-seed.service", "tmp.mount", "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service", "systemd-tmpfiles-clean.timer",
    "systemd-tmpfiles-clean.service", "systemd-networkd-wait-online.service",
    "networking.service", "ssh.service", "cron.service", "getty@tty1.service",
    "serial-getty@ttyS0.service", "systemd-logind.service", "apt-daily.timer",
    "apt-daily-upgrade.timer", "man-db.timer", "logrotate.timer",
)  # fmt: skip


def log(msg: str) -> None:
    print(f"test: {msg}", flush=True)


# ------------------------------------------------------------------------------ kernel, accel


def find_kernel(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("GOVERNOR_VM_KERNEL"):
        return Path(env["GOVERNOR_VM_KERNEL"])
    cands = sorted(
        Path("/boot").glob("vmlinuz-*"),
        key=lambda p: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p.name)],
    )
    if not cands:
        raise RuntimeError("no /boot/vmlinuz-* (apt-get install linux-image-amd64)")
    return cands[-1]


def kernel_version(kernel: Path) -> str:
    return kernel.name.removeprefix("vmlinuz-")


def qemu_binary() -> str:
    q = shutil.which("qemu-system-x86_64")
    if q is None:
        raise RuntimeError("qemu-system-x86_64 not found (apt-get install qemu-system-x86)")
    return q


def accel_args(accel: str, series: str | None = None, thread: str | None = None) -> list[str]:
    """qemu's accelerator arguments; under TCG, ``series`` picks its TCG_THREADS unless
    ``thread`` says (tier_thread)."""
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    thread = thread or TCG_THREADS.get(series or "", "multi")
    return ["-accel", f"tcg,thread={thread}", "-cpu", "max"]


PROBE_MARK = "GOVERNOR-KVM-PROBE-OK"


def probe_kvm(kernel: Path, workdir: Path, timeout: float = 45.0) -> tuple[bool, str]:
    """Boot `kernel` under KVM with a two-line busybox init; KVM works if the marker prints.

    /dev/kvm existing is not enough: nested KVM here opens fine and then aborts
    (`failed to set MSR`) or hangs in the guest."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm not accessible"
    a = initramfs.Newc()
    for d in ("bin", "dev", "proc"):
        a.dir(d)
    a.chardev("dev/console", 5, 1)
    a.file("bin/busybox", initramfs.find_busybox().read_bytes(), 0o755)
    a.symlink("bin/sh", "busybox")
    a.file("init", f"#!/bin/sh\n/bin/busybox echo {PROBE_MARK}\n/bin/busybox poweroff -f\n"
           .encode(), 0o755)  # fmt: skip
    initrd = workdir / "kvm-probe.cpio"
    initrd.write_bytes(a.tobytes())
    console = workdir / "kvm-probe.log"
    argv = [
        qemu_binary(), "-nodefaults", "-no-user-config", "-machine", "pc", *accel_args("kvm"),
        "-m", "256M", "-smp", "1", "-display", "none", "-no-reboot", "-monitor", "none",
        "-chardev", f"file,id=con,path={console}", "-serial", "chardev:con",
        "-kernel", str(kernel), "-initrd", str(initrd), "-append", "console=ttyS0 panic=-1 quiet",
    ]  # fmt: skip
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return False, f"KVM guest did not finish booting within {timeout:.0f}s"
    text = console.read_text(errors="replace") if console.exists() else ""
    if PROBE_MARK in text:
        return True, "KVM guest booted"
    err = (res.stderr.strip().splitlines() or [f"qemu exit {res.returncode}"])[-1]
    return False, f"KVM guest failed: {err}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def detect_accel(kernel: Path, cache_dir: Path, requested: str = "auto") -> tuple[str, str]:
    """("kvm"|"tcg", why). The probe result is cached per host boot, kernel and qemu."""
    if requested in ("kvm", "tcg"):
        return requested, "requested"
    key_src = f"{_boot_id()} {kernel} {kernel.stat().st_mtime} {os.stat(qemu_binary()).st_mtime}"
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    cache = cache_dir / "accel.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(cache.read_text())
        if data["key"] == key:
            return str(data["accel"]), f"{data['why']} (cached)"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvm-probe.", dir=cache_dir) as tmp:
        ok, why = probe_kvm(kernel, Path(tmp))
    accel = "kvm" if ok else "tcg"
    cache.write_text(json.dumps({"key": key, "accel": accel, "why": why}))
    return accel, why


# ------------------------------------------------------------------------------ processes


@dataclass
class Run:
    rc: int | None  # None: killed by the timeout
    wall: float
    # CPU seconds (user + sys) of the process and the descendants it reaped, from wait4's
    # rusage: a guest tier's qemu time against its wall says how many host cores the guest
    # kept busy (None: killed by the timeout, or reaped elsewhere)
    cpu: float | None = None


def _kill_group(proc: subprocess.Popen[bytes], grace: float = 0.0) -> None:
    """SIGINT first when `grace` (pytest then writes its junit xml), then SIGTERM, SIGKILL."""
    steps = [(signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)]
    if grace > 0:
        steps.insert(0, (signal.SIGINT, grace))
    for sig, wait in steps:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# what run_streamed runs now, in any thread: killed when the harness itself is interrupted
RUNNING: set[subprocess.Popen[bytes]] = set()


def run_streamed(
    argv: Sequence[str],
    logfile: Path,
    *,
    timeout: float | None = None,
    prefix: str = "",
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Run:
    """Run argv in its own process group, copy its output to stdout (with `prefix`) and to
    `logfile`; on timeout interrupt, then kill the whole group and return rc None."""
    start = time.monotonic()
    with logfile.open("wb") as lf:
        proc = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env, cwd=cwd,
        )  # fmt: skip
        assert proc.stdout is not None
        out: IO[bytes] = proc.stdout
        RUNNING.add(proc)

        def pump() -> None:
            for line in iter(out.readline, b""):
                lf.write(line)
                lf.flush()
                sys.stdout.write(prefix + line.decode(errors="replace"))
                sys.stdout.flush()

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        rc: int | None
        cpu: float | None = None
        try:
            rc, cpu = wait_rusage(proc, timeout)
        except subprocess.TimeoutExpired:
            log(f"timeout after {timeout:.0f}s: stopping {argv[0]}")
            _kill_group(proc, INTERRUPT_GRACE_S)
            rc = None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            RUNNING.discard(proc)
        t.join(timeout=5)
    return Run(rc, time.monotonic() - start, cpu)


def wait_rusage(proc: subprocess.Popen[bytes], timeout: float | None) -> tuple[int, float | None]:
    """(exit code, CPU seconds) of `proc` once it ends: reaped with wait4, whose rusage is the
    process's own user + sys time plus that of the descendants it waited for (Popen.wait
    drops it). Raises subprocess.TimeoutExpired after `timeout` seconds, as Popen.wait does."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: the exit code without the rusage
            return proc.wait(timeout=0), None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, ru.ru_utime + ru.ru_stime
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout or 0.0)
        time.sleep(0.1 if left is None else min(0.1, left))


class Follower:
    """Copy what a guest appends to a file (virtio-serial FILE chardev) to our stdout."""

    def __init__(self, path: Path, prefix: str) -> None:
        self.path, self.prefix = path, prefix
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Follower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        pos = 0
        pending = b""
        while True:
            stopping = self._stop.is_set()
            with contextlib.suppress(OSError), self.path.open("rb") as f:
                f.seek(pos)
                chunk = f.read()
                pos += len(chunk)
                pending += chunk
            *lines, pending = pending.split(b"\n")
            for ln in lines:
                sys.stdout.write(self.prefix + ln.decode(errors="replace") + "\n")
            if stopping:
                if pending:
                    sys.stdout.write(self.prefix + pending.decode(errors="replace") + "\n")
                sys.stdout.flush()
                return
            sys.stdout.flush()
            self._stop.wait(0.5)


def tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").replace("\r", "").splitlines()
    except OSError:
        return f"(no {path})"
    return "\n".join(lines[-n:])


# ------------------------------------------------------------------------------ guest command


def guest_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    venv = ROOT / ".venv"
    out = {
        "PATH": f"{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "VIRTUAL_ENV": str(venv),
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    for k, v in env.items():
        if k in PASS_ENV or k.startswith(PASS_ENV_PREFIXES):
            out[k] = v
    return out


def guest_script(
    tier: str,
    guest_dir: str,
    pytest_args: Sequence[str],
    environ: dict[str, str] | None = None,
    *,
    full: bool = False,
    budget: float | None = None,
) -> str:
    """Bash script run inside the guest: environment, pytest for `tier`, exit code to
    `guest_dir`/rc (the shared results directory as the guest sees it). With `budget`, pytest
    gets SIGINT after that many seconds (it stops, writes its junit xml, exit 124)."""
    env = guest_env(environ)
    env["GOVERNOR_TEST_TIER"] = tier_suite(tier)[0]
    if tier in COMPAT_TIERS:  # the tests may size themselves down for the compat run
        env["GOVERNOR_TEST_COMPAT"] = tier.removeprefix("compat-")
    else:
        env.pop("GOVERNOR_TEST_COMPAT", None)
    if full:
        env["GOVERNOR_TEST_FULL"] = "1"
    else:
        env.pop("GOVERNOR_TEST_FULL", None)
    argv = guest_pytest_argv(tier, guest_dir, pytest_args, full=full)
    if budget is not None:
        argv = budgeted(argv, budget)
    banner = "kernel $(uname -r), PID 1 $(cat /proc/1/comm), $(nproc) cpus, " + MEMTOTAL_MIB
    return shell_script(
        env, argv, guest_dir, title=f"{tier} tier", banner=banner + ", CI=${CI:-unset}"
    )


MEMTOTAL_MIB = "$(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) MiB"


def budgeted(argv: Sequence[str], budget: float) -> list[str]:
    """``argv`` that gets SIGINT after ``budget`` seconds (pytest then writes its junit xml)."""
    return ["timeout", "--signal=INT", "--kill-after=30", f"{max(1, int(budget))}", *argv]


def shell_script(
    env: dict[str, str],
    argv: Sequence[str],
    guest_dir: str,
    *,
    title: str | None = None,
    banner: str | None = None,
) -> str:
    """THE guest's bash script (every tier, the arm64 guest, `tests/vm/run.py`'s commands):
    ``env`` exported, the tree as the working directory, ``banner`` echoed as "guest: ...",
    ``argv`` run, its exit code to ``guest_dir``/rc (the shared directory as the guest sees
    it), synced."""
    lines = ["#!/bin/bash"]
    if title is not None:
        lines.append(f"# governor test guest: {title}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines.append(f"cd {shlex.quote(str(ROOT))} || exit 127")
    if banner is not None:
        lines.append(f'echo "guest: {banner}"')
    lines += [
        shlex.join(argv),
        "rc=$?",
        f"echo $rc > {shlex.quote(guest_dir)}/rc",
        "sync",
        "exit $rc",
    ]
    return "\n".join(lines) + "\n"


def tier_suite(tier: str) -> tuple[str, str]:
    """(test directory under tests/, pytest marker expression) of a guest tier: a compat tier
    runs the kernel tier's tests marked `compat`."""
    if tier in COMPAT_TIERS:
        return "kernel", f"kernel and {COMPAT_MARK}"
    return tier, tier


def tier_series(tier: str, series: str | None = None) -> str | None:
    """The kernel series a guest tier boots: a compat tier's own, else ``series`` (--kernel;
    None: the host's newest /boot/vmlinuz-*)."""
    if tier in COMPAT_TIERS:
        return tier.removeprefix("compat-")
    if tier == QUADLET_TIER:
        from vm import quadlet  # the tier's own module (it imports this one)

        return quadlet.KERNEL
    return series


def series_kernel(series: str, root: Path = ROOT) -> Path:
    """The vmlinuz of Debian's kernel `series`, fetched and cached by scripts/kernels (which
    also puts its modules under /lib/modules) when it is not cached yet."""
    script = root / "scripts" / "kernels"

    def cached() -> Path | None:
        res = subprocess.run([str(script), "--path", series], capture_output=True, text=True,
                             check=False)  # fmt: skip
        out = res.stdout.strip()
        return Path(out) if res.returncode == 0 and out else None

    path = cached()
    if path is None:
        log(f"kernel {series}: not cached, fetching (scripts/kernels {series})")
        res = subprocess.run([str(script), series], capture_output=True, text=True, check=False)
        path = cached()
        if path is None:
            why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
            raise RuntimeError(f"cannot fetch kernel {series}: {why}")
    return path


def markexpr(base: str, full: bool) -> str:
    """The pytest -m expression of a tier: default runs deselect the `full` tests (neither
    run nor counted as skips), --full keeps them."""
    return base if full else f"{base} and not {FULL_MARK}"


def guest_pytest_argv(
    tier: str, guest_dir: str, pytest_args: Sequence[str], *, full: bool = False
) -> list[str]:
    """The guest's pytest command line. Its temporary directories go under a base of their own
    (``--basetemp``, a name the host never makes): the guest's /tmp is the host's over 9p under
    a tmpfs overlay, and without it pytest numbered /tmp/pytest-of-root/pytest-N from what it
    saw there, the host tier's pytest running beside it under --overlap took the same N, and
    the two directories merged: the guest's numbered `governor-state` directories then met
    the host's (FileExistsError 20 times, a kernel-tier error in a 2026-12-06 run)."""
    py = ROOT / ".venv" / "bin" / "python"
    per_test = FULL_GUEST_TEST_TIMEOUT_S if full else GUEST_TEST_TIMEOUT_S
    tests, expr = tier_suite(tier)
    # no "governor" in it: tests tell the governor's processes by that word in their command
    # line, and an engine's argv names files under tmp_path (a run with it failed every
    # prefetch test: the waiting engine's `sh -c` looked like the prefetch helper)
    basetemp = f"/tmp/pytest-guest-{tier}-{uuid.uuid4().hex[:12]}"
    return [
        str(py), "-m", "pytest", *GUEST_PYTEST_OFF, "-m", markexpr(expr, full), f"tests/{tests}",
        f"--junitxml={guest_dir}/junit.xml", "-o", f"junit_suite_name={tier}", "--durations=10",
        f"--timeout={per_test}", f"--basetemp={basetemp}", *pytest_args,
    ]  # fmt: skip


def _run_quiet(argv: Sequence[str], root: Path, env: dict[str, str] | None = None) -> str | None:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                             cwd=root, env=env)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if res.returncode != 0:
        return (res.stdout + res.stderr).strip()[-2000:] or f"exit {res.returncode}"
    return None


def precompile(
    root: Path = ROOT, dirs: Sequence[str] = BYTECODE_DIRS, test_dirs: Sequence[str] = ()
) -> str | None:
    """Compile the repo's Python files into their __pycache__ directories on the host, with the
    venv's interpreter (the guests' interpreter: same bytecode magic). The guests run with
    PYTHONDONTWRITEBYTECODE=1 and a read-only view of the tree, so without this every Python
    process a guest test starts (each `python -m governor`) compiles governor/ from source
    under TCG. pytest loads test modules and conftests through its assert rewriter, which
    keeps its own cache (<module>.cpython-3XX-pytest-<version>.pyc) only when bytecode writing
    is on: `test_dirs` are collected once here with writing on to fill it.
    Returns None, or why it failed (the tiers still run, only slower)."""
    paths = [str(root / d) for d in dirs if (root / d).is_dir()]
    if paths:
        why = _run_quiet([venv_bin("python"), "-m", "compileall", "-q", "-j", "0", *paths], root)
        if why is not None:
            return f"compileall: {why}"
    tests = [str(root / d) for d in test_dirs if (root / d).is_dir()]
    if tests:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        argv = [venv_bin("python"), "-m", "pytest", "--collect-only", "-q", *GUEST_PYTEST_OFF,
                *tests]  # fmt: skip
        why = _run_quiet(argv, root, env)
        if why is not None:
            return f"pytest --collect-only: {why}"
    return None


def read_rc(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------ tiers


@dataclass
class Options:
    tiers: list[str]
    pytest_args: list[str]
    accel: str
    results: Path
    timeout: float = 0.0  # the running tier's limit (run_tier sets it from `timeouts`)
    timeouts: dict[str, float] = field(default_factory=lambda: dict(TIER_TIMEOUTS))
    deadline: float = DEADLINE_S  # seconds from the start of scripts/test (setup included)
    full: bool = False  # --full: the `full` tests too, larger timeouts
    kernel_vm: str = "qemu"
    serial: bool = True  # one tier at a time (--parallel: the kernel guest alongside the rest)
    overlap: bool = False  # --overlap: overlap_tiers beside lint and host
    kernel_series: str | None = None  # --kernel: the kernel and systemd tiers boot this series
    cpus: int = GUEST_CPUS
    memory_mib: int = GUEST_MEMORY_MIB
    extra_notes: list[str] = field(default_factory=list)
    arch: str = "amd64"  # --arch arm64: the kernel tier is the arm64 guest (tests/vm/arm64.py)
    budgets: dict[str, float] = field(default_factory=dict)  # judge_budget's, per tier (or none)


def venv_bin(name: str) -> str:
    p = ROOT / ".venv" / "bin" / name
    return str(p) if p.exists() else name


def tier_lint(opts: Options) -> TierResult:
    d = opts.results / "lint"
    d.mkdir(parents=True, exist_ok=True)
    checks = {
        "ruff check": [venv_bin("ruff"), "check", "."],
        "ruff format --check": [venv_bin("ruff"), "format", "--check", "."],
        "mypy": [venv_bin("mypy")],
        # the manual (docs/, mkdocs.yml): a broken link or a page left out of the nav fails
        "mkdocs build --strict": [venv_bin("mkdocs"), "build", "--strict", "--quiet"],
    }
    start = time.monotonic()
    end = start + opts.timeout
    res = TierResult("lint", ok=True, wall=0.0)
    passed = 0
    cpus: list[float | None] = []
    for i, (name, argv) in enumerate(checks.items()):
        left = end - time.monotonic()
        if left < 1:
            res.ok = False
            res.notes.append(f"{name} not run: the tier's {opts.timeout:.0f}s were used up")
            res.cases.append(Case(name, 0.0, "failed"))
            continue
        log(f"lint: {name}")
        r = run_streamed(argv, d / f"{i}-{name.split()[0]}-{i}.log", timeout=left)
        res.cases.append(Case(name, r.wall, "passed" if r.rc == 0 else "failed"))
        cpus.append(r.cpu)
        if r.rc == 0:
            passed += 1
        else:
            res.ok = False
            why = f"exit {r.rc}" if r.rc is not None else f"killed at the {opts.timeout:.0f}s limit"
            res.notes.append(f"{name} failed ({why})")
    res.counts = Counts(tests=len(checks), failures=len(checks) - passed)
    res.wall = time.monotonic() - start
    res.cpu = sum(c for c in cpus if c is not None) if cpus and None not in cpus else None
    return res


def tier_host(opts: Options) -> TierResult:
    d = opts.results / "host"
    d.mkdir(parents=True, exist_ok=True)
    junit = d / "junit.xml"
    argv = [
        venv_bin("python"), "-m", "pytest", "-m", markexpr(HOST_MARKEXPR, opts.full),
        f"--junitxml={junit}", "-o", "junit_suite_name=host", f"--timeout={HOST_TEST_TIMEOUT_S}",
        *opts.pytest_args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "GOVERNOR_TEST_FULL"}
    if opts.full:
        env["GOVERNOR_TEST_FULL"] = "1"
    log("host: " + shlex.join(argv))
    r = run_streamed(argv, d / "output.log", timeout=opts.timeout, env=env)
    res = judge_pytest("host", r.rc, junit, r.wall, ci=is_ci())
    res.cpu = r.cpu
    if r.rc is None:
        res.notes.append(f"pytest stopped at the {opts.timeout:.0f}s timeout")
    return res


def tier_kernel(opts: Options, kernel: Path, accel: str) -> TierResult:
    """One virtme-ng boot (--kernel-vm vng); the results dir is shared read-write at the same
    path."""
    d = opts.results / "kernel"
    d.mkdir(parents=True, exist_ok=True)
    script = d / "guest.sh"
    script.write_text(guest_script("kernel", str(d), opts.pytest_args, full=opts.full,
                                   budget=opts.timeout - GUEST_OVERHEAD_S))  # fmt: skip
    vng = shutil.which("vng")
    if vng is None or shutil.which("virtme-run") is None:
        res = TierResult("kernel", ok=False, wall=0.0)
        res.notes.append("vng/virtme-run not on PATH (activate .venv; pip install virtme-ng)")
        return res
    argv = [
        vng, "--run", str(kernel), "--force-9p", "--cpus", str(opts.cpus),
        "--memory", f"{opts.memory_mib}M", "--rwdir", str(d), "--cwd", str(ROOT),
        "--name", "governor-kernel-test", "--exec", f"bash {shlex.quote(str(script))}",
    ]  # fmt: skip
    if accel != "kvm":
        argv.insert(1, "--disable-kvm")
    log("kernel: " + shlex.join(argv))
    r = run_streamed(argv, d / "console.log", timeout=opts.timeout, prefix="[kernel] ")
    rc = read_rc(d / "rc")
    res = judge_pytest("kernel", rc, d / "junit.xml", r.wall, ci=is_ci())
    if r.rc is None:
        res.notes.append(f"guest killed after the {opts.timeout:.0f}s timeout")
    if rc is None:
        log(f"kernel: guest returned no result (vng exit {r.rc}); console tail:")
        print(tail(d / "console.log"), flush=True)
    return res


def systemd_stage2(
    masks: Sequence[str] = SYSTEMD_MASKS, *, keep_generators: Sequence[str] = (), prelude: str = ""
) -> str:
    """PID 1 on the overlayed root before systemd: masks and the test units. ``prelude``: shell
    lines run first; ``keep_generators``: generators left in place (the quadlet tier's podman)."""
    mask_lines = "\n".join(f"ln -sf /dev/null /run/systemd/system/{u}" for u in masks)
    keep = " ".join(shlex.quote(g) for g in keep_generators)
    return f"""#!/bin/bash
# governor test guest, stage 2: prepare units, then become systemd
: > /etc/fstab                     # the host's fstab means nothing here
{prelude}mkdir -p /run/systemd/system
{mask_lines}
# generators: systemd runs every one at boot and again on each daemon-reload (~1.6 s of a
# ~3.5 s reload under TCG; a systemd tier reloads ~17 times) and the guest needs none (fstab
# emptied above, the getty masked, no crypttab/sysv/rc.local on a test guest): masked
mkdir -p /run/systemd/system-generators
shopt -s nullglob
for g in /usr/lib/systemd/system-generators/* /etc/systemd/system-generators/*; do
    case " {keep} " in *" ${{g##*/}} "*) continue ;; esac
    ln -sf /dev/null "/run/systemd/system-generators/${{g##*/}}"
done
shopt -u nullglob
cat > /run/systemd/system/governor-test.target <<'UNIT'
[Unit]
Description=governor systemd-tier tests
Requires=basic.target
Wants=governor-test.service dbus.service
After=basic.target
AllowIsolate=yes
UNIT
cat > /run/systemd/system/governor-test.service <<'UNIT'
[Unit]
Description=governor systemd-tier pytest run
Wants=dbus.service
After=basic.target dbus.service
[Service]
Type=oneshot
ExecStart=/bin/bash /run/vmshare/runcmd.sh
StandardInput=null
StandardOutput=journal+console
Delegate=yes
TimeoutStartSec=infinity
UNIT
exec /lib/systemd/systemd --unit=governor-test.target
"""


PLAIN_STAGE2 = """#!/bin/bash
# governor test guest, stage 2 without systemd: bash is PID 1, cgroup2 mounted, root
# cgroup.subtree_control left EMPTY (enabling controllers is the code's or the fixture's job)
: > /etc/fstab
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t cgroup2 cgroup2 /sys/fs/cgroup
hostname governor-kernel-test
ip link set lo up 2>/dev/null || true
/bin/bash /run/vmshare/runcmd.sh
/run/vm/busybox poweroff -f
sleep 60
"""

GUEST_RUNCMD = """#!/bin/bash
# governor test guest: run the test command with its output on the virtio port "out"
port=
for d in /sys/class/virtio-ports/*; do
    [ "$(cat "$d/name" 2>/dev/null)" = out ] && port=/dev/${d##*/}
done
if [ -z "$port" ]; then
    echo "guest: no virtio output port, using the console" > /dev/console
    port=/dev/console
fi
/bin/bash /run/vmshare/cmd.sh < /dev/null > "$port" 2>&1
rc=$?
[ -s /run/vmshare/rc ] || echo "$rc" > /run/vmshare/rc
sync
# power off at once: an orderly systemd shutdown takes minutes under TCG
/run/vm/busybox poweroff -f
"""


def qemu_systemd_argv(
    kernel: Path,
    initrd: Path,
    share: Path,
    *,
    accel: str,
    cpus: int,
    memory_mib: int,
    series: str | None = None,
    root: Path = Path("/"),
    thread: str | None = None,
) -> list[str]:
    """``series``: the kernel's series (tier_series), for its TCG_BOOT_ARGS and TCG_THREADS
    (``thread``: TCG's threading instead, tier_thread);
    ``root``: the tree
    the guest boots (the host's own, or the quadlet tier's trixie)."""
    for p in (kernel, initrd, share, root):
        if "," in str(p):
            raise RuntimeError(f"qemu option values cannot contain ',': {p}")
    append = "console=ttyS0 panic=-1 quiet loglevel=4 systemd.show_status=1 systemd.log_color=0"
    if accel != "kvm" and series in TCG_BOOT_ARGS:
        append += " " + TCG_BOOT_ARGS[series]
    return [
        qemu_binary(), "-nodefaults", "-no-user-config", "-machine", "pc", *accel_args(accel, series, thread),
        "-m", f"{memory_mib}M", "-smp", str(cpus), "-display", "none", "-vga", "none",
        "-no-reboot", "-monitor", "none",
        "-chardev", f"file,id=con,path={share}/console.log", "-serial", "chardev:con",
        "-kernel", str(kernel), "-initrd", str(initrd), "-append", append,
        "-fsdev", f"local,id=fsroot,path={root},security_model=none,readonly=on,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=fsroot,mount_tag=rootfs",
        "-fsdev", f"local,id=fsshare,path={share},security_model=none,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=fsshare,mount_tag=vmshare",
        "-device", "virtio-serial-pci",
        "-chardev", f"file,id=out,path={share}/output.log",
        "-device", "virtserialport,chardev=out,name=out",
    ]  # fmt: skip


def tier_qemu(opts: Options, tier: str, kernel: Path, accel: str) -> TierResult:
    """One hand-made qemu boot (busybox initramfs, host root over 9p with cache=loose under a
    tmpfs overlay); the results dir is the guest's /run/vmshare. The systemd tier boots
    systemd as PID 1; the kernel tier (the default --kernel-vm qemu) runs the tests from a
    plain bash PID 1 with cgroup2 mounted and the root's subtree_control left empty, as under
    vng."""
    d = opts.results / tier
    d.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    (d / "stage2.sh").write_text(systemd_stage2() if tier == "systemd" else PLAIN_STAGE2)
    (d / "runcmd.sh").write_text(GUEST_RUNCMD)
    (d / "cmd.sh").write_text(guest_script(tier, "/run/vmshare", opts.pytest_args,
                                           full=opts.full,
                                           budget=opts.timeout - GUEST_OVERHEAD_S))  # fmt: skip
    (d / "output.log").write_bytes(b"")
    with tempfile.TemporaryDirectory(prefix="governor-initrd.") as tmp:
        initrd = Path(tmp) / "initrd.cpio"
        initrd.write_bytes(initramfs.build(kernel_version(kernel)))
        argv = qemu_systemd_argv(
            kernel, initrd, d, accel=accel, cpus=opts.cpus, memory_mib=opts.memory_mib,
            series=tier_series(tier, opts.kernel_series), thread=tier_thread(opts, tier),
        )  # fmt: skip
        (d / "qemu.argv").write_text(shlex.join(argv) + "\n")
        log(f"{tier}: qemu ({accel}) boot, argv in {d / 'qemu.argv'}")
        with Follower(d / "output.log", f"[{tier}] "):
            r = run_streamed(argv, d / "qemu.log", timeout=opts.timeout, prefix="[qemu] ")
    wall = time.monotonic() - start
    rc = read_rc(d / "rc")
    res = judge_pytest(tier, rc, d / "junit.xml", wall, ci=is_ci())
    res.cpu = r.cpu  # qemu's: all the guest's vCPUs and its I/O threads
    if r.rc is None:
        res.notes.append(f"guest killed after the {opts.timeout:.0f}s timeout")
    if rc is None or rc == 125:
        log(f"{tier}: guest returned no result (qemu exit {r.rc}); console tail:")
        print(tail(d / "console.log"), flush=True)
    return res


# ------------------------------------------------------------------------------ main


HOST_SIDE: tuple[str, ...] = ("lint", "host")  # the tiers that boot no guest


def overlap_tiers(tiers: Sequence[str], accel: str) -> list[str]:
    """The tiers of `tiers` that --overlap runs in a second thread, one after the other,
    beside the others (which run one after the other in the first): the compat tiers, whose
    qemu then runs all its vCPUs on one host thread (tier_thread), then lint and the host tier,
    which start once the first of the others has ended when another guest follows it (main):
    the compat guests beside the kernel guest, lint and host beside the systemd guest. A
    multi-threaded guest (the kernel tier's 4 vCPUs) averages ~1.1-1.2 of the 2-core CI
    machine's cores (its tests wait: PSI windows, deadlines, the engine's I/O), a one-thread
    guest ~0.8 and the host tier's pytest ~0.6: the second thread fills what the guest of the
    first leaves. Without a multi-threaded guest tier, the compat tiers beside lint and host.
    None under KVM."""
    if accel == "kvm":
        return []
    compat = [t for t in tiers if t in COMPAT_TIERS]
    host = [t for t in tiers if t in HOST_SIDE]
    if not any(t in GUEST_TIERS and t not in COMPAT_TIERS for t in tiers):
        return compat if host else []
    return compat + host


def tier_thread(opts: Options, tier: str) -> str | None:
    """TCG's threading for `tier`'s qemu when the run decides it (--overlap: OVERLAP_THREAD
    for a compat tier), else None (the series' TCG_THREADS)."""
    return OVERLAP_THREAD if opts.overlap and tier in COMPAT_TIERS else None


def parse_tiers(values: Sequence[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        for raw in v.split(","):
            t = raw.strip()
            if not t:
                continue
            # "compat": the default run's compat tiers
            names = DEFAULT_COMPAT_TIERS if t == COMPAT_MARK else (t,)
            for name in names:
                if name not in TIERS:
                    choices = (*TIERS, COMPAT_MARK)
                    raise argparse.ArgumentTypeError(f"unknown tier {t!r} (choose from {choices})")
                if name not in out:
                    out.append(name)
    return sorted(out, key=TIERS.index)


def parse_args(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="scripts/test",
        description="Lint, host tests, and real-kernel tests in qemu guests. "
        "Unrecognised arguments (or everything after --) are passed to pytest.",
        allow_abbrev=False,
    )
    p.add_argument("--tier", action="append", default=[], metavar="TIER[,TIER]",
                   help=f"tiers to run, repeatable or comma list: {','.join(TIERS)} ({COMPAT_MARK}: "
                   f"{' and '.join(DEFAULT_COMPAT_TIERS)}) (default "
                   f"{','.join(DEFAULT_TIERS)})")  # fmt: skip
    p.add_argument("--host-only", action="store_true", help="only lint and host tiers")
    env_timeout = os.environ.get("GOVERNOR_VM_TIMEOUT")
    env_deadline = os.environ.get("GOVERNOR_TEST_DEADLINE")
    p.add_argument("--timeout", type=float, default=float(env_timeout) if env_timeout else None,
                   help="seconds for every tier before it is stopped (default per tier: "
                   f"{_fmt_timeouts(TIER_TIMEOUTS)}; with --full {_fmt_timeouts(FULL_TIER_TIMEOUTS)})")  # fmt: skip
    p.add_argument("--deadline", type=float, default=float(env_deadline) if env_deadline else None,
                   help="seconds for the whole run from the start of scripts/test, setup included: "
                   "a tier running then is stopped, later tiers are not started, the summary is "
                   f"printed (default {DEADLINE_S}; with --full {FULL_DEADLINE_S})")  # fmt: skip
    p.add_argument("--full", action="store_true",
                   default=os.environ.get("GOVERNOR_TEST_FULL") == "1",
                   help="run the tests marked `full` too (the seed's full scale: 1.1 GiB model on "
                   "a 2 GiB board), with GOVERNOR_TEST_FULL=1 and larger timeouts")  # fmt: skip
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"),
                   default=os.environ.get("GOVERNOR_VM_ACCEL", "auto"))  # fmt: skip
    p.add_argument("--kernel-vm", choices=("qemu", "vng"),
                   default=os.environ.get("GOVERNOR_KERNEL_VM", "qemu"),
                   help="kernel tier guest: the harness's own qemu boot (9p cache=loose, no "
                   "systemd), or virtme-ng (uncached 9p root: ~2.7x slower) "
                   "(default %(default)s)")  # fmt: skip
    p.add_argument("--parallel", action="store_true",
                   default=os.environ.get("GOVERNOR_TEST_PARALLEL") == "1",
                   help="run the kernel guest (the longest tier) alongside lint, host and the "
                   "systemd guest instead of one tier after the other; measured on the 2-core "
                   "CI machine: 50 min against 48-56 min serial, the systemd tier 2.2x slower")  # fmt: skip
    p.add_argument("--overlap", action="store_true",
                   default=os.environ.get("GOVERNOR_TEST_OVERLAP") == "1",
                   help="run the compat tiers' guests, their vCPUs on one host thread (single-"
                   "threaded TCG: one core), beside lint and the host tier, the other guests "
                   "one after the other afterwards")  # fmt: skip
    p.add_argument("--arch", choices=("amd64", "arm64"), default="amd64",
                   help="arm64: the kernel tier boots an arm64 guest (qemu-system-aarch64, TCG; "
                   "scripts/arm64-setup) and runs its compat subset and the tiny model under "
                   "an arm64 llama.cpp; opt-in, the only tier by default")  # fmt: skip
    p.add_argument("--kernel", choices=KERNEL_SERIES, default=None, dest="kernel_series",
                   help="boot the kernel and systemd tiers (the default tiers then) on Debian's "
                   "kernel of this series, fetched and cached by scripts/kernels (default: the "
                   "newest /boot/vmlinuz-*); a compat tier boots its own series in any case")  # fmt: skip
    p.add_argument("--results", type=Path, default=None,
                   help="results directory (default out/test-results/<timestamp>)")  # fmt: skip
    args, rest = p.parse_known_args(list(argv))
    if "--" in rest:
        i = rest.index("--")
        rest = rest[:i] + rest[i + 1 :]
    try:
        if args.tier:
            tiers = parse_tiers(args.tier)
        elif args.kernel_series is not None:
            tiers = ["kernel", "systemd"]
        else:
            tiers = list(DEFAULT_TIERS)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.host_only:
        tiers = [t for t in tiers if t not in GUEST_TIERS] if args.tier else ["lint", "host"]
    if args.arch == "arm64":
        if args.kernel_series not in (None, *ARM64_KERNELS):
            p.error(f"--arch arm64 boots the kernels {', '.join(ARM64_KERNELS)} only")
        if not args.tier:
            tiers = ["kernel"]
        elif "systemd" in tiers:
            p.error("--arch arm64 has no systemd guest (only the kernel tier's compat subset)")
    results = args.results or (
        ROOT / "out" / "test-results" / datetime.now().strftime("%Y%m%d-%H%M%S")
    )
    timeouts = dict(FULL_TIER_TIMEOUTS if args.full else TIER_TIMEOUTS)
    if args.timeout is not None:
        timeouts = dict.fromkeys(TIERS, args.timeout)
    deadline = args.deadline if args.deadline is not None else (
        FULL_DEADLINE_S if args.full else DEADLINE_S)  # fmt: skip
    # the budgets are measured for CI's configuration; the others are slower by design
    default_run = not args.full and args.arch == "amd64" and args.kernel_vm == "qemu" and (
        not args.parallel and args.kernel_series is None)  # fmt: skip
    return Options(tiers=tiers, pytest_args=rest, accel=args.accel, results=results.resolve(),
                   timeouts=timeouts, deadline=deadline, full=args.full,
                   memory_mib=FULL_GUEST_MEMORY_MIB if args.full else GUEST_MEMORY_MIB,
                   kernel_vm=args.kernel_vm, serial=not args.parallel,
                   overlap=args.overlap and not args.parallel,
                   arch=args.arch, kernel_series=args.kernel_series,
                   budgets=dict(TIER_BUDGETS) if default_run else {})  # fmt: skip


def _fmt_timeouts(t: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}s" for k, v in t.items())


def setup_seconds(environ: dict[str, str] | None = None, now: float | None = None) -> float:
    """Seconds since scripts/test started (GOVERNOR_TEST_STARTED, epoch seconds, set before
    scripts/setup): the setup's share of the deadline. 0 when unset or implausible."""
    env = os.environ if environ is None else environ
    try:
        started = float(env.get("GOVERNOR_TEST_STARTED", ""))
    except ValueError:
        return 0.0
    spent = (time.time() if now is None else now) - started
    return spent if 0 <= spent < 86400 else 0.0


@dataclass
class Clock:
    """The run's overall deadline, on the monotonic clock."""

    end: float
    deadline: float  # seconds from the start of scripts/test (for the notes)

    def left(self) -> float:
        return self.end - time.monotonic()


def start_or_skip(tier: str, opts: Options, clock: Clock) -> tuple[float, TierResult | None]:
    """(timeout for `tier`, None) or (0, a failed result saying why it was not started)."""
    left = clock.left()
    need = MIN_START_S.get(tier, 60.0)
    if left < need:
        why = (f"not started: {max(left, 0):.0f}s left before the overall deadline "
               f"(--deadline {clock.deadline:.0f}s from the start of scripts/test), the tier "
               f"needs at least {need:.0f}s")  # fmt: skip
        return 0.0, TierResult(tier, ok=False, wall=0.0, notes=[why])
    return min(opts.timeouts.get(tier, DEADLINE_S), left), None


def prune_results(base: Path, keep: int = 10) -> None:
    runs = sorted(p for p in base.glob("2*") if p.is_dir())
    for old in runs[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def restore_sigint() -> None:
    """Started in the background of a shell (`scripts/test ... &`), the harness inherits SIGINT
    ignored, and so would every child: the host tier's pytest would not stop at its time limit
    (SIGINT first, _kill_group) and write its junit xml (2026-12-06: the interrupted-pytest test
    waited out its 120 s grace and found no xml). Python's own handler again: children exec
    with SIGINT at its default."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Sequence[str] | None = None) -> int:
    restore_sigint()
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.monotonic()
    setup_s = setup_seconds()
    clock = Clock(end=t0 + opts.deadline - setup_s, deadline=opts.deadline)
    phases: list[tuple[str, float]] = []
    if setup_s:
        phases.append(("setup (scripts/setup)", setup_s))
    opts.results.mkdir(parents=True, exist_ok=True)
    base = opts.results.parent
    if base.name == "test-results":
        prune_results(base)
        latest = base / "latest"
        with contextlib.suppress(OSError):
            latest.unlink(missing_ok=True)
            latest.symlink_to(opts.results.name)
    log(f"tiers: {', '.join(opts.tiers)}; results in {opts.results}")
    log(f"time: {clock.left():.0f}s left of the {opts.deadline:.0f}s deadline; tier timeouts "
        f"{_fmt_timeouts({t: opts.timeouts[t] for t in opts.tiers})}"
        + ("; --full: the `full` tests too" if opts.full else ""))  # fmt: skip
    if opts.budgets:
        log(f"budgets: {_fmt_timeouts({t: opts.budgets[t] for t in opts.tiers})}")
    if opts.pytest_args:
        log(f"extra pytest arguments: {shlex.join(opts.pytest_args)}")
    kernels: dict[str, Path] = {}  # guest tier -> the vmlinuz it boots
    accel = "tcg"
    if opts.arch == "amd64" and any(t in GUEST_TIERS for t in opts.tiers):
        t_prep = time.monotonic()
        for tier in (t for t in opts.tiers if t in GUEST_TIERS):
            series = tier_series(tier, opts.kernel_series)
            try:
                kernels[tier] = find_kernel() if series is None else series_kernel(series)
            except (RuntimeError, OSError) as exc:
                log(f"cannot prepare the {tier} guest: {exc}")
        first = next(iter(kernels.values()), None)
        try:
            if first is not None:  # KVM works for every kernel or for none: probed once
                accel, why = detect_accel(first, ROOT / "out" / "vm-cache", opts.accel)
                log(f"guest kernels: {', '.join(f'{t} {k}' for t, k in kernels.items())}; "
                    f"accelerator {accel} ({why})")  # fmt: skip
        except (RuntimeError, OSError) as exc:
            log(f"cannot prepare guests: {exc}")
            kernels.clear()
        t = time.monotonic()
        guest_tests = sorted({f"tests/{tier_suite(g)[0]}" for g in opts.tiers if g in GUEST_TIERS})
        why_not = precompile(test_dirs=guest_tests)
        if why_not is None:
            log(f"bytecode: compiled {', '.join(BYTECODE_DIRS)} in {time.monotonic() - t:.1f}s")
        else:
            log(f"bytecode: {why_not}; the guests compile what is missing from source")
        phases.append(("guest preparation (kernel, accel, bytecode)", time.monotonic() - t_prep))

    def run_tier(tier: str) -> TierResult:
        log(f"===== tier {tier} =====")
        timeout, skipped = start_or_skip(tier, opts, clock)
        if skipped is not None:
            log(f"tier {tier}: {skipped.notes[0]}")
            return skipped
        cut = timeout < opts.timeouts.get(tier, DEADLINE_S)
        topts = replace(opts, timeout=timeout)
        try:
            if tier == "lint":
                res = tier_lint(topts)
            elif tier == "host":
                res = tier_host(topts)
            elif tier == "kernel" and opts.arch == "arm64":
                from vm import arm64

                res = arm64.tier_arm64(topts)
            elif tier == QUADLET_TIER and tier in kernels:
                from vm import quadlet

                res = quadlet.tier_quadlet(topts, kernels[tier], accel)
            elif tier not in kernels:
                res = TierResult(tier, ok=False, wall=0.0, notes=["no guest kernel/qemu"])
            elif tier == "kernel" and opts.kernel_vm == "vng":
                res = tier_kernel(topts, kernels[tier], accel)
            else:
                res = tier_qemu(topts, tier, kernels[tier], accel)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            res = TierResult(tier, ok=False, wall=0.0, notes=[f"harness error: {exc}"])
        if cut and not res.ok:
            res.notes.append(f"the overall deadline (--deadline {opts.deadline:.0f}s) cut the "
                             f"tier's timeout to {timeout:.0f}s")  # fmt: skip
        judge_budget(res, opts.budgets.get(tier), ci=is_ci())
        if opts.budgets:  # each test's too, in the configuration they were measured for
            budgets.judge_tests(res)
        log(f"tier {tier}: {'ok' if res.ok else 'FAIL'} in {res.wall:.1f}s")
        return res

    done: dict[str, TierResult] = {}
    # the kernel guest is the longest tier and leaves the host's CPU idle while its tests
    # wait (PSI windows, deadlines, the engine's I/O): the other tiers run meanwhile, one at
    # a time, so at most two things compete for the CPU
    background: threading.Thread | None = None
    behind: list[str] = []  # the tiers the background thread runs, one after the other
    if not opts.serial and "kernel" in opts.tiers and len(opts.tiers) > 1:
        log("--parallel: the kernel guest runs alongside the other tiers")
        behind = ["kernel"]
    elif opts.overlap:
        behind = overlap_tiers(opts.tiers, accel)
    ahead = [t for t in opts.tiers if t not in behind]  # the first thread's, in order
    if opts.overlap and behind:
        log(f"--overlap: {', '.join(behind)} (a compat guest on one host thread of TCG),"
            f" one after the other, beside {', '.join(ahead)}")  # fmt: skip
    ahead_done = threading.Event()  # the first tier ahead (the kernel guest) has ended
    # --overlap: lint and host wait for it when another guest follows it (systemd), so that the
    # kernel guest has the compat guests beside it and the systemd guest the host's pytest
    wait_ahead = opts.overlap and len(ahead) > 1 and any(t in GUEST_TIERS for t in ahead[1:])
    if behind:

        def run_behind() -> None:
            for t in behind:
                if wait_ahead and t in HOST_SIDE:
                    ahead_done.wait()
                done[t] = run_tier(t)

        background = threading.Thread(target=run_behind, daemon=True)
        background.start()
    try:
        for tier in opts.tiers:
            if tier in behind:
                continue
            done[tier] = run_tier(tier)
            ahead_done.set()
        ahead_done.set()
        if background is not None:
            background.join()
    except BaseException:
        ahead_done.set()
        for proc in list(RUNNING):  # the guest of the other thread too
            _kill_group(proc)
        raise
    for tier in opts.tiers:  # fail closed: a tier without a result failed
        done.setdefault(tier, TierResult(tier, ok=False, wall=0.0, notes=["no result"]))
    results = [done[t] for t in opts.tiers]
    total = time.monotonic() - t0
    table = format_table(results, total)
    report = format_durations(results, setup_s + total, phases=phases, budget=opts.deadline)
    for name, text in (("summary.txt", table), ("durations.txt", report)):
        with contextlib.suppress(OSError):
            (opts.results / name).write_text(text + "\n")
    print()
    print(table)
    print()
    print(report)
    print(f"\nresults: {opts.results} (summary.txt, durations.txt)", flush=True)
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
