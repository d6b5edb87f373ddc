"""`governor check` on the guest's own host facts (issue 43 item 14): the guest (2 GiB RAM, no
swap: the scenario where a shed on PSI alone came after the kernel's OOM kill, 2 runs of 2)
warns about a policy that sheds on `board memory some` / `memory some` only and names the
headroom rule; with `board available < headroom` beside them it says nothing. No engine runs:
a compile against the real /proc (kernel tier, a few seconds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PSI_ONLY = """
name = "chat"
[memory]
min = "200M"
max = "600M"
[qos]
class = "interactive"
admit = "shed"
[[pressure]]
when = "board memory some 50ms/1s"
do = ["log", "shed"]
[[pressure]]
when = "memory some 150ms/2s"
do = ["log", "shed"]
"""
HEADROOM = """
[[pressure]]
when = "board available < headroom"
do = ["log", "shed"]
cooldown = "3s"
"""


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = int(value.split()[0]) * 1024
    return out


def _check(*policies: Path) -> list[list[str]]:
    """`governor check` of each policy, side by side (each compile is ~14 s under TCG): the
    warning lines of each."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "governor", "check", str(p)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for p in policies
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stdout + stderr
        out.append([line for line in stdout.splitlines() if line.startswith("  warning: ")])
    return out


@pytest.fixture
def out_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    xml = getattr(request.config.option, "xmlpath", None)
    return Path(xml).parent if xml else tmp_path


@pytest.mark.kernel(controllers=("memory",), psi=True)
def test_check_warns_about_a_psi_only_shed_on_the_swapless_guest(
    tmp_path: Path, out_dir: Path
) -> None:
    mem = _meminfo()
    # the guest's own share beside the slices (test_shed_guest.py's GUEST_OS_MIB), for the record
    (out_dir / "guest-memory.txt").write_text(
        f"MemTotal {mem['MemTotal'] >> 20} MiB, MemAvailable {mem['MemAvailable'] >> 20} MiB\n"
    )
    assert mem["SwapTotal"] == 0, "the guest boots without swap"
    psi_only, headroom = tmp_path / "psi.toml", tmp_path / "headroom.toml"
    psi_only.write_text(PSI_ONLY)
    headroom.write_text(PSI_ONLY + HEADROOM)
    (warning,), none = _check(psi_only, headroom)
    print(warning)
    assert (
        "rules #0 (board memory some 50ms/1s), #1 (memory some 150ms/2s) shed on PSI alone"
        in warning
    )
    assert "this board has 0 MiB of swap" in warning
    assert 'add a [[pressure]] rule with when = "board available < headroom"' in warning
    assert none == []
