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


def _check(policy: Path) -> list[str]:
    res = subprocess.run(
        [sys.executable, "-m", "governor", "check", str(policy)],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return [line for line in res.stdout.splitlines() if line.startswith("  warning: ")]


@pytest.mark.kernel(controllers=("memory",), psi=True)
def test_check_warns_about_a_psi_only_shed_on_the_swapless_guest(tmp_path: Path) -> None:
    mem = _meminfo()
    print(f"MemTotal {mem['MemTotal'] >> 20} MiB, MemAvailable {mem['MemAvailable'] >> 20} MiB")
    assert mem["SwapTotal"] == 0, "the guest boots without swap"
    psi_only, headroom = tmp_path / "psi.toml", tmp_path / "headroom.toml"
    psi_only.write_text(PSI_ONLY)
    headroom.write_text(PSI_ONLY + HEADROOM)
    (warning,) = _check(psi_only)
    print(warning)
    assert (
        "rules #0 (board memory some 50ms/1s), #1 (memory some 150ms/2s) shed on PSI alone"
        in warning
    )
    assert "this board has 0 MiB of swap" in warning
    assert 'add a [[pressure]] rule with when = "board available < headroom"' in warning
    assert _check(headroom) == []
