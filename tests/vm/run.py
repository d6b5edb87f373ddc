"""Run one command in a test guest: the same qemu boots as the kernel and systemd test tiers,
for demos and benchmarks that need a real cgroup v2 kernel (or systemd as PID 1).

    python -m vm.run [--guest kernel|systemd] [--timeout S] [--accel auto|kvm|tcg] [--cpus N]
                     -- CMD ARGS

(from the tests/ directory on sys.path, as scripts/test does). The command runs as root in the
repo directory with the project venv on PATH; its output streams here; the exit status is the
command's (125: the guest gave no result, 124: timeout). The guest's root cgroup
subtree_control starts empty in the plain guest.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from vm import harness, initramfs

# a demo or benchmark guest is killed after this many seconds (--timeout)
RUN_TIMEOUT_S = 3000.0


def command_script(argv: Sequence[str], guest_dir: str) -> str:
    return harness.shell_script(harness.guest_env(), argv, guest_dir)


def run(
    argv: Sequence[str],
    *,
    guest: str = "kernel",
    timeout: float = RUN_TIMEOUT_S,
    accel: str = "auto",
    cpus: int = harness.GUEST_CPUS,
) -> int:
    kernel = harness.find_kernel()
    chosen, why = harness.detect_accel(kernel, harness.ROOT / "out" / "vm-cache", accel)
    harness.log(f"guest {guest}: kernel {kernel.name}, accel {chosen} ({why})")
    with tempfile.TemporaryDirectory(prefix=f"governor-{guest}.") as tmp:
        d = Path(tmp)
        (d / "stage2.sh").write_text(
            harness.systemd_stage2() if guest == "systemd" else harness.PLAIN_STAGE2
        )
        (d / "runcmd.sh").write_text(harness.GUEST_RUNCMD)
        (d / "cmd.sh").write_text(command_script(argv, "/run/vmshare"))
        (d / "output.log").write_bytes(b"")
        initrd = d / "initrd.cpio"
        initrd.write_bytes(initramfs.build(harness.kernel_version(kernel)))
        qemu = harness.qemu_systemd_argv(
            kernel,
            initrd,
            d,
            accel=chosen,
            cpus=cpus,
            memory_mib=harness.GUEST_MEMORY_MIB,
        )
        start = time.monotonic()
        with harness.Follower(d / "output.log", ""):
            r = harness.run_streamed(qemu, d / "qemu.log", timeout=timeout, prefix="[qemu] ")
        harness.log(f"guest {guest}: {time.monotonic() - start:.1f}s")
        rc = harness.read_rc(d / "rc")
        if r.rc is None:
            return 124
        if rc is None:
            print(harness.tail(d / "console.log"), flush=True)
            return 125
        return rc


def main(args: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="vm.run", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("--guest", choices=("kernel", "systemd"), default="kernel")
    p.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S)
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto")
    p.add_argument("--cpus", type=int, default=harness.GUEST_CPUS, help="the guest's vCPUs")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(args)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command given")
    return run(cmd, guest=a.guest, timeout=a.timeout, accel=a.accel, cpus=a.cpus)


if __name__ == "__main__":
    sys.exit(main())
