"""Device memory of a governed engine on a real kernel (kernel tier): vgem GEM buffers.

vgem's GEM objects are shmem-backed like panfrost/panthor's: an engine stand-in
(tests/helpers/vgem.py) allocates three 16 MiB dumb buffers, exports two as dma-buf fds, writes
their pages, and shares the first with a forked child. Under `governor launch` with `[device]
memory` (checked against MemAvailable at preflight) and a `device memory > 24M` rule:

- status shows 32 MiB under drm/dma-buf (the two exported buffers, each once, though the first
  is held by two processes and by Python's mmap dup: summing per fd would say more);
- the shmem charge is in the slice's memory.current and memory.stat shmem (memcg does see
  shmem-backed GEM; it is the contiguous rknpu buffers that no cgroup sees);
- the rule fires with the 32 MiB it saw; metrics export governor_device_memory_bytes and the
  board's unaccounted memory; the launch report keeps the device memory peak.

Kernel 6.1 (the guest's) prints no drm-* memory keys for vgem (the helper came in 6.5), so the
dma-buf view is all there is here; the DRM keys are tested on pasted fdinfo text
(tests/unit/kernel/test_devmem.py). Needs: root, the memory controller, vgem.ko (Debian's
kernel ships it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice

from governor.kernel.devmem import DmaBuf, parse_fdinfo
from governor.metrics.collector import registry
from governor.rundir.state import read_states

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def _vgem_card() -> Path:
    modprobe = shutil.which("modprobe") or "/usr/sbin/modprobe"
    res = subprocess.run(
        [modprobe, "vgem"], capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, f"modprobe vgem: {res.stderr}"
    for card in sorted(Path("/sys/class/drm").glob("card[0-9]*")):
        # vgem registers a bare platform device named "vgem" (no platform driver binds it)
        if (card / "device").resolve().name == "vgem":
            return Path("/dev/dri") / card.name
    raise AssertionError("modprobe vgem made no /sys/class/drm/card* of driver vgem")


def _naive_dmabuf_bytes(pids: list[int]) -> int:
    """What summing every dma-buf fd would say (no dedupe by inode)."""
    n = 0
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
            item = parse_fdinfo(fd.read_text())
            n += item.size if isinstance(item, DmaBuf) else 0
    return n


@pytest.mark.kernel(controllers=("memory", "pids"), root=True)
def test_vgem_buffers_are_shown_deduplicated_charged_as_shmem_and_fire_a_device_rule(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    card = _vgem_card()
    run = tmp_path / "run"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    policy = tmp_path / "dev.toml"
    policy.write_text(
        f'name = "dev"\nslice = "{scratch_slice.name}"\n'
        + textwrap.dedent(
            """
            [memory]
            max = "512M"
            [device]
            memory = "64M"
            [[pressure]]
            when = "device memory > 24M"
            do = ["log"]
            """
        )
    )
    ready, report = tmp_path / "ready.json", tmp_path / "report.json"
    engine = (sys.executable, str(REPO / "tests/helpers/vgem.py"), str(card), str(ready))
    launch = ("launch", "--policy", str(policy), "--report", str(report))
    gov = subprocess.Popen(
        [sys.executable, "-m", "governor", *launch, "--", *engine],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    group = scratch_slice.path / "dev"
    state = run / "dev" / "state.json"
    try:
        cgroups.wait_for(ready.exists, timeout=240, what="the engine's buffers")
        pids = json.loads(ready.read_text())["pids"]

        def fired() -> bool:
            rules = json.loads(state.read_text()).get("rules") or [{}]
            return bool(rules[0].get("fired"))

        cgroups.wait_for(fired, timeout=60, what="the device memory rule")
        res = subprocess.run(
            [sys.executable, "-m", "governor", "status", "dev", "--json"],
            capture_output=True, text=True, timeout=240, cwd=REPO, env=env, check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        (item,) = json.loads(res.stdout)
        assert item["device_memory"] == {
            "rows": [{"driver": "drm", "region": "dma-buf", "bytes": 32 * MIB}],
            "total": 32 * MIB,
        }
        assert _naive_dmabuf_bytes(pids) > 32 * MIB  # what a per-fd sum would have said
        assert isinstance(item["board"]["unaccounted"], int)
        assert item["board"]["cma_total"] is None  # the guest's kernel has no CMA
        assert item["rules"][0]["fired"] == 1
        # memcg sees shmem-backed GEM: charged to the engine's slice, not in its RSS
        stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
        assert int(stat["shmem"]) >= 32 * MIB
        assert int((group / "memory.current").read_text()) >= 32 * MIB
        text = _exposition(run)
        assert (
            'governor_device_memory_bytes{driver="drm",policy="dev",region="dma-buf"} 3.3554432e+07'
            in text
        )
        assert 'governor_board_unaccounted_bytes{policy="dev"}' in text
        assert "governor_cma_total_bytes" not in text  # absent, not 0
    finally:
        if gov.poll() is None:
            gov.send_signal(signal.SIGTERM)
        _out, err = gov.communicate(timeout=120)
    assert "rule.fired" in err, err[-3000:]
    mon = json.loads(report.read_text())["extra"]["monitor"]
    assert mon["device_memory_peak_bytes"] == 32 * MIB
    assert mon["rules"][0]["fired"] == 1


def _exposition(run: Path) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry(lambda: read_states(run), run)).decode()
