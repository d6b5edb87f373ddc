"""`governor render quadlet`, read by Podman's own Quadlet generator (issue 48 item 2): in the
quadlet guest (Debian 13, systemd as PID 1, Debian's podman; tests/vm/quadlet.py) the rendered
file goes to /etc/containers/systemd/, `systemctl daemon-reload` runs the generator,
`systemctl start` runs llama-server in a container (an image `podman import`ed from a local
rootfs tar: no registry) inside the policy's slice; the limits are read back from the
service's cgroup files, llama-server answers /health, and `governor status` sees the slice
through `governor monitor --cgroup` (what the rendered file's comment says to run beside it).

Runs in the quadlet guest: flock /tmp/governor-guest.lock scripts/test --tier quadlet
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOVERNOR = [sys.executable, "-m", "governor"]
ENGINE = Path("/var/lib/governor/engine")
IMAGE = "localhost/governor-llama:test"
NAME = "qchat"
PORT = 18080
UNIT_DIR = Path("/etc/containers/systemd")
CGROUP_ROOT = Path("/sys/fs/cgroup")
TIMEOUT = 300
MIB = 1 << 20

POLICY = f"""\
name = "{NAME}"
slice = "governor.slice"
[memory]
max = "768M"
high = "640M"
min = "32M"
swap_max = "0"
oom_group = true
[pids]
max = 256
[engine]
kind = "llama.cpp"
ready_timeout = "240s"
"""
ARGV = (
    str(ENGINE / "bin" / "llama-server"), "-m", str(ENGINE / "models" / "tiny.gguf"),
    "-c", "256", "--cache-ram", "64", "-t", "2", "--host", "127.0.0.1", "--port", str(PORT),
)  # fmt: skip


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=TIMEOUT, check=False, cwd=REPO
    )
    if check and res.returncode != 0:
        pytest.fail(f"{' '.join(argv)}: exit {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


def _health(deadline: float) -> int | None:
    status = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5) as r:
                status = r.status
        except urllib.error.HTTPError as err:
            status = err.code  # 503 while the model loads
        except OSError:
            status = None
        if status == 200:
            return status
        time.sleep(1)
    return status


@pytest.fixture
def container(tmp_path: Path) -> Iterator[Path]:
    """The policy file, the image imported, the rendered file installed; all removed after."""
    policy = tmp_path / f"{NAME}.toml"
    policy.write_text(POLICY)
    _run("podman", "import", os.environ["GOVERNOR_QUADLET_IMAGE_TAR"], IMAGE)
    unit = UNIT_DIR / f"{NAME}.container"
    yield policy
    _run("systemctl", "stop", f"{NAME}.service", check=False)
    unit.unlink(missing_ok=True)
    _run("systemctl", "daemon-reload", check=False)
    _run("podman", "rmi", "--force", IMAGE, check=False)


def test_rendered_container_runs_llama_server_in_the_policy_slice_with_its_limits(
    container: Path,
) -> None:
    policy = container
    text = _run(*GOVERNOR, "render", "quadlet", str(policy), "--image", IMAGE, "--", *ARGV).stdout
    assert "MemoryMax=" in text, text  # the guest has the memory controller: limits rendered
    (UNIT_DIR / f"{NAME}.container").write_text(text)
    _run("systemctl", "daemon-reload")
    gen = _run("/usr/lib/systemd/system-generators/podman-system-generator", "--dryrun",
               check=False)  # fmt: skip
    shown = _run("systemctl", "cat", f"{NAME}.service", check=False)
    assert shown.returncode == 0, f"the generator made no {NAME}.service:\n{gen.stderr}"

    started = time.monotonic()
    _run("systemctl", "start", f"{NAME}.service")
    assert _health(started + TIMEOUT) == 200, _run("journalctl", "-u", f"{NAME}.service",
                                                   "--no-pager", check=False).stdout  # fmt: skip
    ready_s = time.monotonic() - started

    cg = _run("systemctl", "show", "-P", "ControlGroup", f"{NAME}.service").stdout.strip()
    assert cg == f"/governor.slice/governor-{NAME}.slice/{NAME}.service", cg
    service = CGROUP_ROOT / cg.lstrip("/")
    limits = {
        f: (service / f).read_text().strip()
        for f in ("memory.max", "memory.high", "memory.min", "memory.swap.max", "pids.max")
    }
    assert limits == {
        "memory.max": str(768 * MIB),
        "memory.high": str(640 * MIB),
        "memory.min": str(32 * MIB),
        "memory.swap.max": "0",
        "pids.max": "256",
    }
    # llama-server itself (the container's pid 1, not conmon) is below the service's cgroup
    pid = _run("podman", "inspect", "--format", "{{.State.Pid}}", NAME).stdout.strip()
    own = Path(f"/proc/{pid}/cgroup").read_text().strip().split("::", 1)[1]
    assert own.startswith(cg + "/"), own
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "llama-server"
    charged = int((service / "memory.current").read_text())
    assert charged > 0

    # `governor status` sees the slice through the monitor the rendered comment names
    monitor = subprocess.Popen(
        [*GOVERNOR, "monitor", str(policy), "--cgroup", cg.lstrip("/"), "--duration", "240"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline and monitor.poll() is None:
            res = _run(*GOVERNOR, "status", NAME, "--json", check=False)
            if res.returncode == 0:
                status = json.loads(res.stdout)
                break
            time.sleep(2)
        assert status is not None, f"status never saw {NAME} (monitor rc {monitor.poll()})"
    finally:
        monitor.terminate()
        print(f"governor monitor: {monitor.communicate(timeout=60)[0][-2000:]}")
    entry = status[0] if isinstance(status, list) else status
    assert entry["policy"] == NAME, entry
    assert entry["state"] == "running", entry
    assert f"{NAME}.service" in str(entry["cgroup"]), entry
    print(f"quadlet: ready in {ready_s:.1f}s, limits {limits}, memory.current {charged}")
    print(f"governor status: {json.dumps(entry)[:2000]}")
