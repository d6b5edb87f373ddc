"""The arm64 guest (``scripts/test --arch arm64``, issue 37): the kernel tier's compat subset and
the tiny model under an arm64 llama.cpp, on Debian's arm64 kernel in qemu-system-aarch64 (TCG).

scripts/arm64-setup provides (cached in GOVERNOR_ARM64_CACHE, default
/var/lib/governor/engine-arm64): the kernel (``kernel/vmlinuz``), an arm64 root file system
(``rootfs``: Debian minbase + python3, the kernel's modules, the governor's dependencies as arm64
wheels in /opt/governor-site) and llama.cpp cross-built for arm64 (``bin``). The guest boots the
same two stages as the x86 qemu tiers (tests/vm/initramfs.py, harness.PLAIN_STAGE2): stage 1
mounts the arm64 tree read-only over 9p under a tmpfs overlay; stage 2 (this module's) also
mounts, read-only over 9p, the work tree at its host path, the arm64 llama.cpp at
/var/lib/governor/engine/bin and the host's synthetic models at /var/lib/governor/engine/models
(GGUF files do not depend on the architecture), where tests/engine/paths.py looks.

``--kernel 6.18`` boots trixie-backports' 6.18 arm64 kernel instead (its own rootfs, for its
modules; issue 47) and runs the compat subset without the tiny model, whose arm64 llama.cpp
does not depend on the kernel (the 6.1 run proves it; the engine build is skipped).

Opt-in, not in the default run: arm64 under TCG on an x86 machine is several times slower
than the x86 guest (the report's durations say how much).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from vm import harness, initramfs
from vm.junit import TierResult, judge_pytest
from vm.skips import is_ci

CACHE = Path(os.environ.get("GOVERNOR_ARM64_CACHE", "/var/lib/governor/engine-arm64"))
X86_ENGINE_CACHE = Path(os.environ.get("GOVERNOR_ENGINE_CACHE", "/var/lib/governor/engine"))
GUEST_ENGINE = "/var/lib/governor/engine"  # tests/engine/paths.py's default, inside the guest
SITE = "/opt/governor-site"  # the arm64 wheels in the root file system (arm64-setup)
CPU = "cortex-a76"  # RK3588's big core, Raspberry Pi 5's core: asimddp, no i8mm
# The compat subset (issue 37): launch and its limits, the OOM group kill, the engine tree
# after SIGKILL of the governor, the pressure actions, prefetch, shed, ready, and the tiny model
# under the arm64 llama.cpp. Selected by name until the `compat` marker lands (branch kernels).
COMPAT_K = " or ".join(
    (
        "test_launch_enables_controllers_itself_and_limits_read_back",
        "test_oom_group_kills_the_engine_tree_and_only_it",
        "test_governor_sigkill_takes_the_engine_tree_down",
        "test_reclaim_signal_and_exec_actions_act_on_the_real_group",
        "test_populate_charges_the_slice_and_not_the_governor",
        "test_shed_throttles_then_freezes_the_background_and_gives_it_back",
        "test_tiny_model_launch_reports_speed_peak_and_estimate",
    )
)

TINY_TEST = "test_tiny_model_launch_reports_speed_peak_and_estimate"


def compat_selection(
    pyproject: Path = harness.ROOT / "pyproject.toml", *, tiny: bool = True
) -> str:
    """The -k expression of the compat subset: the `compat` marker once it is registered (-k
    matches markers too), with the tiny model test (``tiny``); the names above until then."""
    registered = re.search(r'^\s*"compat:', pyproject.read_text(), re.MULTILINE) is not None
    if not registered:
        return COMPAT_K if tiny else COMPAT_K.replace(f" or {TINY_TEST}", "")
    return f"compat or {TINY_TEST}" if tiny else "compat"


@dataclass(frozen=True)
class Kernel:
    """What scripts/arm64-setup caches for one kernel series (GOVERNOR_ARM64_KERNEL)."""

    series: str
    dir: Path  # vmlinuz, .complete (its version)
    rootfs: Path  # the root file system with its modules
    engine: bool  # the tiny model runs on it (6.1: the engine does not depend on the kernel)


def kernel_for(series: str | None) -> Kernel:
    """6.1 (bookworm's, the default) or 6.18 (trixie-backports', issue 47): see harness."""
    if series in (None, "6.1"):
        return Kernel("6.1", CACHE / "kernel", CACHE / "rootfs", engine=True)
    if series not in harness.ARM64_KERNELS:
        raise RuntimeError(
            f"no arm64 guest for kernel {series} (choose from {harness.ARM64_KERNELS})"
        )
    return Kernel(series, CACHE / f"kernel-{series}", CACHE / f"rootfs-for-{series}", engine=False)


STAGE2 = """#!/bin/bash
# governor arm64 test guest, stage 2: the shares of the work tree and the engine, then as the
# x86 kernel tier's plain stage 2 (bash as PID 1, cgroup2 mounted, subtree_control empty)
m9p() {{ mkdir -p "$2" && /run/vm/busybox mount -t 9p \\
    -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 "$1" "$2" \\
    || echo "guest stage2: cannot mount $1 at $2" > /dev/console; }}
m9p work {root}
m9p engine {engine}/bin
m9p models {engine}/models
{plain}"""


def stage2() -> str:
    plain = harness.PLAIN_STAGE2.split("\n", 1)[1]  # without its #! line
    return STAGE2.format(
        root=shlex.quote(str(harness.ROOT)), engine=shlex.quote(GUEST_ENGINE), plain=plain
    )


def guest_script(
    guest_dir: str, pytest_args: list[str], budget: float, *, tiny: bool = True
) -> str:
    """harness.guest_script for the arm64 tree: the tree's python3 with the arm64 wheels and the
    work tree on PYTHONPATH instead of the host's venv."""
    env = harness.guest_env()
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env["PYTHONPATH"] = f"{harness.ROOT}:{SITE}"
    env["GOVERNOR_TEST_TIER"] = "kernel"
    env.pop("GOVERNOR_ENGINE_CACHE", None)  # the guest's engine is at the default path
    argv = harness.guest_pytest_argv("kernel", guest_dir, pytest_args)
    argv[0] = "python3"
    # the llama-server tests need the openai client and a server build: neither is arm64 here
    argv.append("--ignore=tests/kernel/test_server_guest.py")
    if not any(a == "-k" or a.startswith("-k") for a in pytest_args):
        argv += ["-k", compat_selection(tiny=tiny)]
    banner = f"$(uname -m), kernel $(uname -r), $(nproc) cpus, {harness.MEMTOTAL_MIB}"
    return harness.shell_script(
        env,
        harness.budgeted(argv, budget),
        guest_dir,
        title="arm64, kernel tier (compat subset)",
        banner=banner + ", $(grep -m1 Features /proc/cpuinfo)",
    )


def qemu_argv(
    kernel: Path, initrd: Path, share: Path, shares: dict[str, Path], *, cpus: int, memory_mib: int
) -> list[str]:
    for p in (kernel, initrd, share, *shares.values()):
        if "," in str(p):
            raise RuntimeError(f"qemu option values cannot contain ',': {p}")
    append = "console=ttyAMA0 panic=-1 quiet loglevel=4"
    argv = [
        "qemu-system-aarch64", "-nodefaults", "-no-user-config", "-machine", "virt",
        "-cpu", CPU, "-accel", "tcg,thread=multi", "-m", f"{memory_mib}M", "-smp", str(cpus),
        "-display", "none", "-no-reboot", "-monitor", "none",
        "-chardev", f"file,id=con,path={share}/console.log", "-serial", "chardev:con",
        "-kernel", str(kernel), "-initrd", str(initrd), "-append", append,
        "-fsdev", f"local,id=fsshare,path={share},security_model=none,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=fsshare,mount_tag=vmshare",
        "-device", "virtio-serial-pci",
        "-chardev", f"file,id=out,path={share}/output.log",
        "-device", "virtserialport,chardev=out,name=out",
    ]  # fmt: skip
    for tag, path in shares.items():
        argv += [
            "-fsdev", f"local,id=fs{tag},path={path},security_model=none,readonly=on,multidevs=remap",
            "-device", f"virtio-9p-pci,fsdev=fs{tag},mount_tag={tag}",
        ]  # fmt: skip
    return argv


def setup(series: str = "6.1") -> str | None:
    """scripts/arm64-setup (cached: seconds) for the kernel ``series``; None, or why it failed."""
    res = subprocess.run(
        [str(harness.ROOT / "scripts" / "arm64-setup")],
        capture_output=True, text=True, check=False, timeout=3600,
        env={**os.environ, "GOVERNOR_ARM64_KERNEL": series},
    )  # fmt: skip
    for line in (res.stdout + res.stderr).splitlines():
        harness.log(line)
    return None if res.returncode == 0 else f"scripts/arm64-setup exit {res.returncode}"


def tier_arm64(opts: harness.Options) -> TierResult:
    """One arm64 boot running the kernel tier's compat subset (or the given -k)."""
    d = opts.results / "kernel-arm64"
    d.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    k = kernel_for(opts.kernel_series)
    why = setup(k.series)
    if why is not None:
        return TierResult("kernel", ok=False, wall=0.0, notes=[why])
    rootfs = k.rootfs.resolve()
    kernel = k.dir / "vmlinuz"
    kver = (k.dir / ".complete").read_text().strip()
    shares = {"rootfs": rootfs, "work": harness.ROOT}
    if k.engine:
        shares["engine"] = (CACHE / "bin").resolve()
        shares["models"] = (X86_ENGINE_CACHE / "models").resolve()
    why = harness.precompile(test_dirs=["tests/kernel"])
    if why is not None:
        harness.log(f"bytecode: {why}; the guest compiles what is missing from source")
    (d / "stage2.sh").write_text(stage2())
    (d / "runcmd.sh").write_text(harness.GUEST_RUNCMD)
    (d / "cmd.sh").write_text(
        guest_script(
            "/run/vmshare", opts.pytest_args, opts.timeout - harness.GUEST_OVERHEAD_S, tiny=k.engine
        )
    )
    (d / "output.log").write_bytes(b"")
    with tempfile.TemporaryDirectory(prefix="governor-initrd-arm64.") as tmp:
        initrd = Path(tmp) / "initrd.cpio"
        initrd.write_bytes(
            initramfs.build(kver, busybox=rootfs / "bin" / "busybox", basedir=rootfs)
        )
        argv = qemu_argv(kernel, initrd, d, shares, cpus=opts.cpus, memory_mib=opts.memory_mib)
        (d / "qemu.argv").write_text(shlex.join(argv) + "\n")
        harness.log(f"kernel (arm64): qemu-system-aarch64 -cpu {CPU} (tcg), kernel {kver}")
        with harness.Follower(d / "output.log", "[kernel-arm64] "):
            r = harness.run_streamed(argv, d / "qemu.log", timeout=opts.timeout, prefix="[qemu] ")
    wall = time.monotonic() - start
    rc = harness.read_rc(d / "rc")
    res = judge_pytest("kernel", rc, d / "junit.xml", wall, ci=is_ci())
    res.notes.append(f"arm64 guest ({CPU}, kernel {kver})")
    if r.rc is None:
        res.notes.append(f"guest killed after the {opts.timeout:.0f}s timeout")
    if rc is None or rc == 125:
        harness.log(f"kernel (arm64): guest returned no result (qemu exit {r.rc}); console tail:")
        print(harness.tail(d / "console.log"), flush=True)
    return res
