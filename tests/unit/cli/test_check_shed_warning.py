"""`check` warns that a shed on PSI alone comes too late on a board without (enough) swap, and
names the headroom rule (issue 43 item 14; governor/compile/headroom.py psi_shed_warning).

Needs: the rk3588 host fixture (copied, its /proc/meminfo's SwapTotal set per test), the engine
cache only for the --engine-argv case (skipped without it, as the other check tests)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from governor.cli.app import main

REPO = Path(__file__).resolve().parents[3]
RK3588 = REPO / "tests" / "fixtures" / "hosts" / "rk3588"

POLICY = """
name = "chat"
[memory]
max = "1G"
[qos]
class = "interactive"
admit = "shed"
[[pressure]]
when = "board memory some 100ms/1s"
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
WARNING = (
    "  warning: rules #0 (board memory some 100ms/1s), #1 (memory some 150ms/2s) shed on PSI"
    " alone, and this board has {swap} MiB of swap (less than a quarter of its 1966 MiB): the"
    " stall comes once the board is full, after the kernel's OOM killer; shed before it: add a"
    ' [[pressure]] rule with when = "board available < headroom" and do = ["log", "shed"]'
)


def _board(tmp_path: Path, swap_kib: int) -> Path:
    root = tmp_path / "board"
    shutil.copytree(RK3588, root, symlinks=True)
    meminfo = root / "proc" / "meminfo"
    text = re.sub(
        r"(?m)^SwapTotal:\s+\d+ kB$", f"SwapTotal:       {swap_kib} kB", meminfo.read_text()
    )
    meminfo.write_text(text)
    return root


def _check(capsys: pytest.CaptureFixture[str], root: Path, policy: Path) -> list[str]:
    with pytest.raises(SystemExit) as info:
        main(["--root", str(root), "check", str(policy)])
    out, err = capsys.readouterr()
    assert info.value.code == 0, err
    return out.splitlines()


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "chat.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("swap_mib", [0, 256])  # none, and less than a quarter of 1966 MiB
def test_a_psi_only_shed_without_enough_swap_is_warned_with_the_headroom_rule(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, swap_mib: int
) -> None:
    lines = _check(capsys, _board(tmp_path, swap_mib << 10), _policy(tmp_path, POLICY))
    assert lines[0] == WARNING.format(swap=swap_mib)
    assert lines[1] == f"{tmp_path / 'chat.toml'}: ok (1 cgroup writes)"


def test_no_warning_with_the_headroom_rule(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = _check(capsys, _board(tmp_path, 0), _policy(tmp_path, POLICY + HEADROOM))
    assert not [line for line in lines if line.startswith("  warning:")]


def test_no_warning_with_a_memavailable_floor_that_sheds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    floor = '[[pressure]]\nwhen = "board available < 200M"\ndo = ["shed"]\n'
    lines = _check(capsys, _board(tmp_path, 0), _policy(tmp_path, POLICY + floor))
    assert not [line for line in lines if line.startswith("  warning:")]


def test_no_warning_with_swap_of_a_quarter_of_the_memory_or_more(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = _check(capsys, _board(tmp_path, 2013492 // 4 + 1), _policy(tmp_path, POLICY))
    assert not [line for line in lines if line.startswith("  warning:")]


def test_no_warning_without_a_shed_on_psi(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = POLICY.replace('do = ["log", "shed"]', 'do = ["log"]')
    lines = _check(capsys, _board(tmp_path, 0), _policy(tmp_path, text))
    assert not [line for line in lines if line.startswith("  warning:")]


def test_the_warning_says_the_headroom_rule_needs_a_peak(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = POLICY.replace('[memory]\nmax = "1G"\n', "")
    lines = _check(capsys, _board(tmp_path, 0), _policy(tmp_path, text))
    assert lines[0].endswith("(it needs [memory] max or high: the slice's peak)")


def test_no_warning_for_a_shed_on_cpu_pressure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A CPU stall says nothing about the board filling up: not the memory shed warned about."""
    text = POLICY.replace("board memory some 100ms/1s", "board cpu some 100ms/1s").replace(
        'when = "memory some 150ms/2s"\ndo = ["log", "shed"]',
        'when = "memory some 150ms/2s"\ndo = ["log"]',
    )
    lines = _check(capsys, _board(tmp_path, 0), _policy(tmp_path, text))
    assert not [line for line in lines if line.startswith("  warning:")]
