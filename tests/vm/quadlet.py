"""The quadlet guest (``scripts/test --tier quadlet``, issue 48 item 2): Debian 13 (trixie) with
systemd as PID 1 and Debian's podman on Debian 13's own kernel (6.12), where the output of
`governor render quadlet` is read by Podman's Quadlet generator and runs llama-server in a
container inside the policy's slice (tests/quadlet).

Made here, on the host, before the boot (cached, keyed by their recipes):

- the root file system (``rootfs()``): mmdebstrap minbase + systemd, dbus, podman, python3, and
  the governor's run-time and test dependencies as cp313 wheels in /opt/governor-site (pip
  --target on this machine), a directory in GOVERNOR_ROOTFS_CACHE (default
  /var/lib/governor/rootfs);
- the container image's root file system (``image_tar()``): llama-server of the engine cache,
  the shared libraries ``ldd`` names for it (libgomp, libstdc++, libc...) and the tiny model, a
  tar the guest turns into an image with ``podman import`` (no registry).

The guest boots the same two stages as the other qemu tiers (tests/vm/initramfs.py): stage 1
mounts the trixie tree read-only over 9p under a tmpfs overlay; stage 2 (this module's) mounts
the work tree and the engine cache at their host paths (read-only 9p), sets podman up for a
guest (vfs storage on tmpfs, the host network: no netfilter modules), and becomes systemd with
the podman generator left in place (the systemd tier masks every generator).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

from vm import harness, initramfs
from vm.junit import TierResult, judge_pytest
from vm.skips import is_ci

SUITE = "trixie"
KERNEL = "6.12"  # Debian 13's own kernel (scripts/kernels caches it)
CACHE = Path(os.environ.get("GOVERNOR_ROOTFS_CACHE", "/var/lib/governor/rootfs"))
ENGINE = Path(os.environ.get("GOVERNOR_ENGINE_CACHE", "/var/lib/governor/engine"))
GUEST_ENGINE = "/var/lib/governor/engine"  # tests/engine/paths.py's default, inside the guest
SITE = "/opt/governor-site"
# systemd as PID 1, dbus for systemctl, podman (its Depends bring conmon, crun and the Quadlet
# generator; netavark: podman 5 refuses to start without a network backend), procps/psmisc
# for the tests, busybox-static for the initramfs's stage 1
DEBS = ("systemd", "systemd-sysv", "dbus", "podman", "netavark", "python3", "procps", "psmisc",
        "util-linux", "iproute2", "busybox-static", "kmod")  # fmt: skip
TEST_WHEELS = ("pytest>=8", "pytest-timeout>=2.3")
IMAGE = "localhost/governor-llama:test"


def wheels(pyproject: Path = harness.ROOT / "pyproject.toml") -> tuple[str, ...]:
    """The governor's run-time requirements (pyproject's, with their bounds) and pytest."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return (*(d for d in deps if "python_version <" not in d), *TEST_WHEELS)


def recipe() -> str:
    return f"{SUITE} minbase {','.join(DEBS)} cp313 {' '.join(wheels())}"


def rootfs_dir() -> Path:
    return CACHE / f"{SUITE}-quadlet-{hashlib.sha256(recipe().encode()).hexdigest()[:12]}"


def rootfs() -> Path:
    """The cached trixie tree (made once: mmdebstrap under nice, then pip --target)."""
    d = rootfs_dir()
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one mmdebstrap per cache
        if (d / ".complete").exists():
            return d
        part = d.with_name(d.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        t0 = time.monotonic()
        harness.log(f"quadlet: building the {SUITE} root file system in {part}")
        subprocess.run(
            ["nice", "mmdebstrap", "--quiet", "--variant=minbase",
             f"--include={','.join(DEBS)}", SUITE, str(part)],
            check=True, timeout=1800,
        )  # fmt: skip
        subprocess.run(
            ["nice", harness.venv_bin("python"), "-m", "pip", "install", "--quiet",
             "--no-compile", "--target", str(part / SITE.lstrip("/")),
             "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
             "--platform", "manylinux_2_28_x86_64", "--implementation", "cp",
             "--python-version", "3.13", "--only-binary=:all:", *wheels()],
            check=True, timeout=900,
        )  # fmt: skip
        # bytecode for trixie's python3 (pip --target ran on the host's interpreter): the guest
        # cannot write it into the read-only tree, and compiling pydantic under TCG takes long
        subprocess.run(
            ["chroot", str(part), "python3", "-m", "compileall", "-q", SITE],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        (part / ".complete").write_text(recipe() + "\n")
        part.rename(d)
        harness.log(f"quadlet: root file system made in {time.monotonic() - t0:.0f}s: {d}")
    return d


def _libraries(binary: Path) -> list[Path]:
    """The shared libraries ``ldd`` resolves for ``binary``, at the paths it names."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
    libs = []
    for line in out.stdout.splitlines():
        words = line.split()
        if "=>" in words and words[words.index("=>") + 1].startswith("/"):
            libs.append(Path(words[words.index("=>") + 1]))
        elif words and words[0].startswith("/"):  # the dynamic loader
            libs.append(Path(words[0]))
    return libs


def image_tar(dest: Path, engine: Path = ENGINE) -> Path:
    """A root file system tar for ``podman import``: llama-server and the tiny model at the
    engine cache's paths (where the rendered Volume= lines mount the guest's own), and the
    libraries ldd names (llama-server is static but for libgomp, libstdc++ and libc)."""
    binary = engine / "bin" / "llama-server"
    files = {Path(GUEST_ENGINE) / "bin" / "llama-server": binary}
    files[Path(GUEST_ENGINE) / "models" / "tiny.gguf"] = engine / "models" / "tiny.gguf"
    for lib in _libraries(binary):
        files[lib] = lib
    with tarfile.open(dest, "w") as tar:
        for arc, src in sorted(files.items()):
            # the file's content under the path the loader or the argv asks for (no symlinks)
            tar.add(src.resolve(), arcname=str(arc).lstrip("/"), recursive=False)
        for tmp in ("tmp",):
            info = tarfile.TarInfo(tmp)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
    return dest


# podman in a guest whose root is an overlay over 9p: vfs storage (overlay on overlay is
# refused), the host's network (no netfilter modules in the guest), events to a file
CONTAINERS_CONF = """[containers]
netns = "host"
[engine]
events_logger = "file"
cgroup_manager = "systemd"
"""
STORAGE_CONF = """[storage]
driver = "vfs"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
"""


def stage2() -> str:
    """The systemd tier's stage 2 with the podman generator kept, the work tree and the engine
    cache mounted at their host paths, and podman's guest configuration."""
    mounts = f"""m9p() {{ mkdir -p "$2" && mount -t 9p \\
    -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 "$1" "$2" \\
    || echo "guest stage2: cannot mount $1 at $2" > /dev/console; }}
m9p work {shlex.quote(str(harness.ROOT))}
m9p engine {shlex.quote(GUEST_ENGINE)}
# a machine id, so systemd's first-boot prompts (systemd-firstboot) never wait on the console
# (mmdebstrap leaves "uninitialized": a first boot, which also runs preset-all)
grep -qE '^[0-9a-f]{{32}}$' /etc/machine-id 2>/dev/null \\
    || {{ rm -f /etc/machine-id; systemd-machine-id-setup > /dev/null; }}
mkdir -p /etc/containers /etc/containers/systemd
cat > /etc/containers/containers.conf <<'CONF'
{CONTAINERS_CONF}CONF
cat > /etc/containers/storage.conf <<'CONF'
{STORAGE_CONF}CONF
"""
    return harness.systemd_stage2(
        (*harness.SYSTEMD_MASKS, "systemd-firstboot.service"),
        keep_generators=("podman-system-generator",),
        prelude=mounts,
    )


def guest_script(guest_dir: str, pytest_args: list[str], budget: float) -> str:
    """harness.guest_script for the trixie tree: its python3 with the cp313 wheels and the work
    tree on PYTHONPATH instead of the host's venv; bytecode in the guest's tmpfs."""
    env = harness.guest_env()
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = "/var/tmp/pycache"
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env["PYTHONPATH"] = f"{harness.ROOT}:{SITE}"
    env["GOVERNOR_TEST_TIER"] = "quadlet"
    env["GOVERNOR_QUADLET_IMAGE_TAR"] = f"{guest_dir}/image.tar"
    env.pop("GOVERNOR_ENGINE_CACHE", None)  # the guest's engine is at the default path
    argv = harness.guest_pytest_argv("quadlet", guest_dir, pytest_args)
    argv[0] = "python3"
    banner = "kernel $(uname -r), PID 1 $(cat /proc/1/comm), $(podman --version), " + (
        harness.MEMTOTAL_MIB
    )
    return harness.shell_script(
        env, harness.budgeted(argv, budget), guest_dir, title="quadlet tier", banner=banner
    )


def qemu_argv(kernel: Path, initrd: Path, share: Path, root: Path, shares: dict[str, Path],
              *, accel: str, cpus: int, memory_mib: int) -> list[str]:  # fmt: skip
    argv = harness.qemu_systemd_argv(
        kernel, initrd, share, accel=accel, cpus=cpus, memory_mib=memory_mib, root=root
    )
    for tag, path in shares.items():
        if "," in str(path):
            raise RuntimeError(f"qemu option values cannot contain ',': {path}")
        argv += [
            "-fsdev", f"local,id=fs{tag},path={path},security_model=none,readonly=on,multidevs=remap",
            "-device", f"virtio-9p-pci,fsdev=fs{tag},mount_tag={tag}",
        ]  # fmt: skip
    return argv


def tier_quadlet(opts: harness.Options, kernel: Path, accel: str) -> TierResult:
    """One boot of the trixie tree with systemd as PID 1 running tests/quadlet."""
    d = opts.results / "quadlet"
    d.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        root = rootfs()
    except (subprocess.SubprocessError, OSError) as exc:
        return TierResult("quadlet", ok=False, wall=0.0, notes=[f"rootfs: {exc}"])
    made = time.monotonic() - start
    image_tar(d / "image.tar")
    (d / "stage2.sh").write_text(stage2())
    (d / "runcmd.sh").write_text(harness.GUEST_RUNCMD)
    budget = opts.timeout - harness.GUEST_OVERHEAD_S - made
    (d / "cmd.sh").write_text(guest_script("/run/vmshare", opts.pytest_args, budget))
    (d / "output.log").write_bytes(b"")
    shares = {"work": harness.ROOT, "engine": ENGINE.resolve()}
    with tempfile.TemporaryDirectory(prefix="governor-initrd-quadlet.") as tmp:
        initrd = Path(tmp) / "initrd.cpio"
        initrd.write_bytes(initramfs.build(harness.kernel_version(kernel)))
        argv = qemu_argv(kernel, initrd, d, root, shares, accel=accel, cpus=opts.cpus,
                         memory_mib=opts.memory_mib)  # fmt: skip
        (d / "qemu.argv").write_text(shlex.join(argv) + "\n")
        harness.log(f"quadlet: qemu ({accel}) boot of {root.name}, kernel {kernel}")
        with harness.Follower(d / "output.log", "[quadlet] "):
            r = harness.run_streamed(
                argv, d / "qemu.log", timeout=opts.timeout - made, prefix="[qemu] "
            )
    wall = time.monotonic() - start
    rc = harness.read_rc(d / "rc")
    res = judge_pytest("quadlet", rc, d / "junit.xml", wall, ci=is_ci())
    res.notes.append(f"trixie root file system {root.name} ({made:.0f}s to make or find)")
    if r.rc is None:
        res.notes.append(f"guest killed after the {opts.timeout:.0f}s timeout")
    if rc is None or rc == 125:
        harness.log(f"quadlet: guest returned no result (qemu exit {r.rc}); console tail:")
        print(harness.tail(d / "console.log"), flush=True)
    return res
