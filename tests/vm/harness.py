"""The project's test runner: lint, host tier, and one qemu guest boot per real-kernel tier.

Run through scripts/test (which runs scripts/setup and activates .venv first)::

    scripts/test                         # lint, host, kernel, systemd
    scripts/test --host-only             # lint, host
    scripts/test --tier kernel,systemd   # only the guest tiers
    scripts/test --tier kernel -k oom    # extra arguments go to every pytest run

Tiers
  lint     ruff check, ruff format --check, mypy (config in pyproject.toml)
  host     pytest -m "not kernel and not systemd and not engine" on the host
  kernel   ONE qemu boot of the host kernel (busybox initramfs, host root over 9p with
           cache=loose under a tmpfs overlay, bash as PID 1, no systemd); inside, pytest -m
           kernel tests/kernel (cgroup2 at /sys/fs/cgroup with all controllers, root, PSI);
           --kernel-vm vng boots virtme-ng instead (same kernel; about 2.7x slower: its 9p
           root is uncached, so every Python import walks the host over 9p)
  systemd  ONE hand-made qemu boot with systemd as PID 1 (busybox initramfs, host root over 9p
           under a tmpfs overlay); inside, pytest -m systemd tests/systemd runs as a
           Type=oneshot Delegate=yes service

Before a guest boots, the repo's Python files are compiled to bytecode on the host
(compileall into their __pycache__ directories, which git ignores): the guests run with
PYTHONDONTWRITEBYTECODE=1 and would otherwise compile governor/ from source, under TCG, in every
Python process a test starts.

Results (junit xml, guest console logs, pytest output) go to out/test-results/<stamp>/<tier>/,
which the guests share read-write. A tier fails when pytest fails, collects no tests (exit 5),
or when a guest does not boot or return an exit code before --timeout.

Environment: GOVERNOR_VM_ACCEL=auto|kvm|tcg, GOVERNOR_VM_KERNEL=/boot/vmlinuz-...,
GOVERNOR_VM_TIMEOUT=seconds, GOVERNOR_KERNEL_VM=qemu|vng, CI (exported to the guests; CI=true
turns missing-requirement skips into failures).
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

from vm import initramfs
from vm.junit import Counts, TierResult, format_table, judge_pytest

ROOT = Path(__file__).resolve().parents[2]
TIERS: tuple[str, ...] = ("lint", "host", "kernel", "systemd")
GUEST_TIERS: tuple[str, ...] = ("kernel", "systemd")
HOST_MARKEXPR = "not kernel and not systemd and not engine"
DEFAULT_TIMEOUT = 3000  # per tier; the kernel tier with the real engine takes ~32 min under TCG
# per test (pytest-timeout): a hung test fails alone instead of eating the tier's timeout
HOST_TEST_TIMEOUT_S = 300
GUEST_TEST_TIMEOUT_S = 1500  # the 1.1 GiB model's forced run is ~6 min of it under TCG
GUEST_CPUS = 4
GUEST_MEMORY_MIB = 2048
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


def accel_args(accel: str) -> list[str]:
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
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
    `logfile`; on timeout kill the whole group and return rc None."""
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
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"timeout after {timeout:.0f}s: killing {argv[0]}")
            _kill_group(proc)
            rc = None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            RUNNING.discard(proc)
        t.join(timeout=5)
    return Run(rc, time.monotonic() - start)


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
    tier: str, guest_dir: str, pytest_args: Sequence[str], environ: dict[str, str] | None = None
) -> str:
    """Bash script run inside the guest: environment, pytest for `tier`, exit code to
    `guest_dir`/rc (the shared results directory as the guest sees it)."""
    env = guest_env(environ)
    env["GOVERNOR_TEST_TIER"] = tier
    argv = guest_pytest_argv(tier, guest_dir, pytest_args)
    lines = ["#!/bin/bash", f"# governor test guest: {tier} tier"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines += [
        f"cd {shlex.quote(str(ROOT))} || exit 127",
        'echo "guest: kernel $(uname -r), PID 1 $(cat /proc/1/comm), $(nproc) cpus,'
        " $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) MiB,"
        ' CI=${CI:-unset}"',
        shlex.join(argv),
        "rc=$?",
        f"echo $rc > {shlex.quote(guest_dir)}/rc",
        "sync",
        "exit $rc",
    ]
    return "\n".join(lines) + "\n"


def guest_pytest_argv(tier: str, guest_dir: str, pytest_args: Sequence[str]) -> list[str]:
    py = ROOT / ".venv" / "bin" / "python"
    return [
        str(py), "-m", "pytest", *GUEST_PYTEST_OFF, "-m", tier, f"tests/{tier}",
        f"--junitxml={guest_dir}/junit.xml", "-o", f"junit_suite_name={tier}", "--durations=10",
        f"--timeout={GUEST_TEST_TIMEOUT_S}", *pytest_args,
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
    timeout: float
    accel: str
    results: Path
    kernel_vm: str = "qemu"
    serial: bool = True  # one tier at a time (--parallel: the kernel guest alongside the rest)
    cpus: int = GUEST_CPUS
    memory_mib: int = GUEST_MEMORY_MIB
    extra_notes: list[str] = field(default_factory=list)


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
    }
    start = time.monotonic()
    res = TierResult("lint", ok=True, wall=0.0)
    passed = 0
    for i, (name, argv) in enumerate(checks.items()):
        log(f"lint: {name}")
        r = run_streamed(argv, d / f"{i}-{name.split()[0]}-{i}.log", timeout=opts.timeout)
        if r.rc == 0:
            passed += 1
        else:
            res.ok = False
            res.notes.append(f"{name} failed (exit {r.rc})")
    res.counts = Counts(tests=len(checks), failures=len(checks) - passed)
    res.wall = time.monotonic() - start
    return res


def tier_host(opts: Options) -> TierResult:
    d = opts.results / "host"
    d.mkdir(parents=True, exist_ok=True)
    junit = d / "junit.xml"
    argv = [
        venv_bin("python"), "-m", "pytest", "-m", HOST_MARKEXPR, f"--junitxml={junit}",
        "-o", "junit_suite_name=host", f"--timeout={HOST_TEST_TIMEOUT_S}", *opts.pytest_args,
    ]  # fmt: skip
    log("host: " + shlex.join(argv))
    r = run_streamed(argv, d / "output.log", timeout=opts.timeout)
    return judge_pytest("host", r.rc, junit, r.wall)


def tier_kernel(opts: Options, kernel: Path, accel: str) -> TierResult:
    """One virtme-ng boot (--kernel-vm vng); the results dir is shared read-write at the same
    path."""
    d = opts.results / "kernel"
    d.mkdir(parents=True, exist_ok=True)
    script = d / "guest.sh"
    script.write_text(guest_script("kernel", str(d), opts.pytest_args))
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
    res = judge_pytest("kernel", rc, d / "junit.xml", r.wall)
    if r.rc is None:
        res.notes.append(f"guest killed after the {opts.timeout:.0f}s timeout")
    if rc is None:
        log(f"kernel: guest returned no result (vng exit {r.rc}); console tail:")
        print(tail(d / "console.log"), flush=True)
    return res


def systemd_stage2(masks: Sequence[str] = SYSTEMD_MASKS) -> str:
    """PID 1 on the overlayed host root before systemd: masks and the test units."""
    mask_lines = "\n".join(f"ln -sf /dev/null /run/systemd/system/{u}" for u in masks)
    return f"""#!/bin/bash
# governor test guest, stage 2: prepare units, then become systemd
: > /etc/fstab                     # the host's fstab means nothing here
mkdir -p /run/systemd/system
{mask_lines}
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
    kernel: Path, initrd: Path, share: Path, *, accel: str, cpus: int, memory_mib: int
) -> list[str]:
    for p in (kernel, initrd, share):
        if "," in str(p):
            raise RuntimeError(f"qemu option values cannot contain ',': {p}")
    append = "console=ttyS0 panic=-1 quiet loglevel=4 systemd.show_status=1 systemd.log_color=0"
    return [
        qemu_binary(), "-nodefaults", "-no-user-config", "-machine", "pc", *accel_args(accel),
        "-m", f"{memory_mib}M", "-smp", str(cpus), "-display", "none", "-vga", "none",
        "-no-reboot", "-monitor", "none",
        "-chardev", f"file,id=con,path={share}/console.log", "-serial", "chardev:con",
        "-kernel", str(kernel), "-initrd", str(initrd), "-append", append,
        "-fsdev", "local,id=fsroot,path=/,security_model=none,readonly=on,multidevs=remap",
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
    (d / "cmd.sh").write_text(guest_script(tier, "/run/vmshare", opts.pytest_args))
    (d / "output.log").write_bytes(b"")
    with tempfile.TemporaryDirectory(prefix="governor-initrd.") as tmp:
        initrd = Path(tmp) / "initrd.cpio"
        initrd.write_bytes(initramfs.build(kernel_version(kernel)))
        argv = qemu_systemd_argv(
            kernel, initrd, d, accel=accel, cpus=opts.cpus, memory_mib=opts.memory_mib
        )
        (d / "qemu.argv").write_text(shlex.join(argv) + "\n")
        log(f"{tier}: qemu ({accel}) boot, argv in {d / 'qemu.argv'}")
        with Follower(d / "output.log", f"[{tier}] "):
            r = run_streamed(argv, d / "qemu.log", timeout=opts.timeout, prefix="[qemu] ")
    wall = time.monotonic() - start
    rc = read_rc(d / "rc")
    res = judge_pytest(tier, rc, d / "junit.xml", wall)
    if r.rc is None:
        res.notes.append(f"guest killed after the {opts.timeout:.0f}s timeout")
    if rc is None or rc == 125:
        log(f"{tier}: guest returned no result (qemu exit {r.rc}); console tail:")
        print(tail(d / "console.log"), flush=True)
    return res


# ------------------------------------------------------------------------------ main


def parse_tiers(values: Sequence[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        for raw in v.split(","):
            t = raw.strip()
            if not t:
                continue
            if t not in TIERS:
                raise argparse.ArgumentTypeError(f"unknown tier {t!r} (choose from {TIERS})")
            if t not in out:
                out.append(t)
    return sorted(out, key=TIERS.index)


def parse_args(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="scripts/test",
        description="Lint, host tests, and real-kernel tests in qemu guests. "
        "Unrecognised arguments (or everything after --) are passed to pytest.",
        allow_abbrev=False,
    )
    p.add_argument("--tier", action="append", default=[], metavar="TIER[,TIER]",
                   help=f"tiers to run, repeatable or comma list: {','.join(TIERS)} (default all)")  # fmt: skip
    p.add_argument("--host-only", action="store_true", help="only lint and host tiers")
    p.add_argument("--timeout", type=float,
                   default=float(os.environ.get("GOVERNOR_VM_TIMEOUT", DEFAULT_TIMEOUT)),
                   help="seconds per tier before the guest is killed (default %(default)s)")  # fmt: skip
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
    p.add_argument("--results", type=Path, default=None,
                   help="results directory (default out/test-results/<timestamp>)")  # fmt: skip
    args, rest = p.parse_known_args(list(argv))
    if "--" in rest:
        i = rest.index("--")
        rest = rest[:i] + rest[i + 1 :]
    try:
        tiers = parse_tiers(args.tier) if args.tier else list(TIERS)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.host_only:
        tiers = [t for t in tiers if t not in GUEST_TIERS] if args.tier else ["lint", "host"]
    results = args.results or (
        ROOT / "out" / "test-results" / datetime.now().strftime("%Y%m%d-%H%M%S")
    )
    return Options(tiers=tiers, pytest_args=rest, timeout=args.timeout, accel=args.accel,
                   results=results.resolve(), kernel_vm=args.kernel_vm,
                   serial=not args.parallel)  # fmt: skip


def prune_results(base: Path, keep: int = 10) -> None:
    runs = sorted(p for p in base.glob("2*") if p.is_dir())
    for old in runs[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.monotonic()
    opts.results.mkdir(parents=True, exist_ok=True)
    base = opts.results.parent
    if base.name == "test-results":
        prune_results(base)
        latest = base / "latest"
        with contextlib.suppress(OSError):
            latest.unlink(missing_ok=True)
            latest.symlink_to(opts.results.name)
    log(f"tiers: {', '.join(opts.tiers)}; results in {opts.results}")
    if opts.pytest_args:
        log(f"extra pytest arguments: {shlex.join(opts.pytest_args)}")
    kernel: Path | None = None
    accel = "tcg"
    if any(t in GUEST_TIERS for t in opts.tiers):
        try:
            kernel = find_kernel()
            accel, why = detect_accel(kernel, ROOT / "out" / "vm-cache", opts.accel)
            log(f"guest kernel {kernel}; accelerator {accel} ({why})")
        except (RuntimeError, OSError) as exc:
            log(f"cannot prepare guests: {exc}")
        t = time.monotonic()
        guest_tests = [f"tests/{g}" for g in opts.tiers if g in GUEST_TIERS]
        why_not = precompile(test_dirs=guest_tests)
        if why_not is None:
            log(f"bytecode: compiled {', '.join(BYTECODE_DIRS)} in {time.monotonic() - t:.1f}s")
        else:
            log(f"bytecode: {why_not}; the guests compile what is missing from source")

    def run_tier(tier: str) -> TierResult:
        log(f"===== tier {tier} =====")
        try:
            if tier == "lint":
                res = tier_lint(opts)
            elif tier == "host":
                res = tier_host(opts)
            elif kernel is None:
                res = TierResult(tier, ok=False, wall=0.0, notes=["no guest kernel/qemu"])
            elif tier == "kernel" and opts.kernel_vm == "vng":
                res = tier_kernel(opts, kernel, accel)
            else:
                res = tier_qemu(opts, tier, kernel, accel)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            res = TierResult(tier, ok=False, wall=0.0, notes=[f"harness error: {exc}"])
        log(f"tier {tier}: {'ok' if res.ok else 'FAIL'} in {res.wall:.1f}s")
        return res

    done: dict[str, TierResult] = {}
    # the kernel guest is the longest tier and leaves the host's CPU idle while its tests
    # wait (PSI windows, deadlines, the engine's I/O): the other tiers run meanwhile, one at
    # a time, so at most two things compete for the CPU
    background = None
    if not opts.serial and "kernel" in opts.tiers and len(opts.tiers) > 1:
        log("--parallel: the kernel guest runs alongside the other tiers")
        background = threading.Thread(
            target=lambda: done.__setitem__("kernel", run_tier("kernel")), daemon=True
        )
        background.start()
    try:
        for tier in opts.tiers:
            if background is None or tier != "kernel":
                done[tier] = run_tier(tier)
        if background is not None:
            background.join()
    except BaseException:
        for proc in list(RUNNING):  # the guest of the other thread too
            _kill_group(proc)
        raise
    for tier in opts.tiers:  # fail closed: a tier without a result failed
        done.setdefault(tier, TierResult(tier, ok=False, wall=0.0, notes=["no result"]))
    results = [done[t] for t in opts.tiers]
    total = time.monotonic() - t0
    print()
    print(format_table(results, total))
    print(f"\nresults: {opts.results}", flush=True)
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
