"""[memory] zswap_max / zswap_writeback (issue 33): compiled to memory.zswap.max and
memory.zswap.writeback, refused naming the kernel version on a kernel without the file unless
``--allow-missing zswap``, and in the unit table (MemoryZSwapMax=, MemoryZSwapWriteback=).

Needs: the host fixture trees (rk3588 runs 6.1: zswap.max yes, zswap.writeback no)."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.compile.compiler import compile_plan
from governor.compile.doctor import swap_finding
from governor.errors import HostError, PolicyError
from governor.kernel import files as kf
from governor.kernel.swap import BoardSwap, SwapDevice, SwapReader, ZramStat
from governor.operate.diff import skipped_name
from governor.plan import unitmap
from governor.plan.host import HostFacts, probe
from governor.plan.model import Plan
from governor.policy.loader import load_text
from governor.record import replace

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
BASE = 'name = "bg"\n[memory]\nmax = "512M"\nswap_max = "256M"\n'


def _host(version: tuple[int, int] = (6, 1)) -> HostFacts:
    facts = probe(HOSTS / "rk3588", target="governor.slice/bg")
    return replace(facts, kernel_version=version, kernel_release=f"{version[0]}.{version[1]}.0")


def _compile(extra: str, host: HostFacts, allow: frozenset[str] = frozenset()) -> Plan:
    return compile_plan(load_text(BASE + extra, source="t.toml"), host, allow_missing=allow)


def _writes(plan: Plan) -> dict[str, str]:
    return {w.file: w.value for w in plan.writes}


def test_zswap_keys_compile_to_their_files_after_swap_max() -> None:
    plan = _compile('zswap_max = "64M"\nzswap_writeback = false\n', _host((6, 8)))
    w = _writes(plan)
    assert w[kf.MEMORY_ZSWAP_MAX] == str(64 << 20)
    assert w[kf.MEMORY_ZSWAP_WRITEBACK] == "0"
    files = [x.file for x in plan.writes]
    assert files.index(kf.MEMORY_SWAP_MAX) < files.index(kf.MEMORY_ZSWAP_MAX)
    assert files.index(kf.MEMORY_ZSWAP_WRITEBACK) < files.index(kf.MEMORY_MAX)
    reasons = {x.file: x.reason for x in plan.writes}
    assert reasons[kf.MEMORY_ZSWAP_WRITEBACK] == "memory.zswap_writeback"


def test_zswap_writeback_on_a_6_1_kernel_is_refused_naming_the_version() -> None:
    with pytest.raises(HostError) as info:
        _compile("zswap_writeback = true\n", _host((6, 1)))
    assert "memory.zswap.writeback needs kernel >= 6.8 (this host: 6.1.0)" in str(info.value)
    assert "--allow-missing zswap" in (info.value.hint or "")


def test_zswap_max_before_5_19_is_refused_and_6_1_takes_it() -> None:
    with pytest.raises(HostError, match=r"memory.zswap.max needs kernel >= 5.19"):
        _compile('zswap_max = "0"\n', _host((5, 10)))
    assert _writes(_compile('zswap_max = "0"\n', _host((6, 1))))[kf.MEMORY_ZSWAP_MAX] == "0"


def test_allow_missing_zswap_leaves_the_write_out_and_says_so() -> None:
    plan = _compile("zswap_writeback = false\n", _host((6, 1)), frozenset({"zswap"}))
    assert kf.MEMORY_ZSWAP_WRITEBACK not in _writes(plan)
    assert plan.degraded == ("memory.zswap.writeback = 0 (kernel 6.1 < 6.8)",)
    assert skipped_name(plan.degraded[0]) == "zswap"
    assert kf.MEMORY_SWAP_MAX in _writes(plan)  # the rest of [memory] is applied


def test_zswap_writeback_takes_a_bool_only() -> None:
    with pytest.raises(PolicyError):
        load_text(BASE + 'zswap_writeback = "false"\n', source="t.toml")


@pytest.mark.parametrize(
    ("version", "unit_files", "governor_files"),
    [
        (252, set(), {kf.MEMORY_ZSWAP_MAX, kf.MEMORY_ZSWAP_WRITEBACK}),
        (254, {kf.MEMORY_ZSWAP_MAX}, {kf.MEMORY_ZSWAP_WRITEBACK}),
        (256, {kf.MEMORY_ZSWAP_MAX, kf.MEMORY_ZSWAP_WRITEBACK}, set()),
    ],
)
def test_the_unit_carries_the_zswap_keys_where_systemd_has_the_directive(
    version: int, unit_files: set[str], governor_files: set[str]
) -> None:
    plan = _compile('zswap_max = "64M"\nzswap_writeback = false\n', _host((6, 8)))
    sp = unitmap.split(plan, version)
    zswap = {kf.MEMORY_ZSWAP_MAX, kf.MEMORY_ZSWAP_WRITEBACK}
    assert {u.write.file for u in sp.unit} & zswap == unit_files
    assert {d.write.file for d in sp.governor} & zswap == governor_files
    ini = {u.directive: u.ini for u in sp.unit}
    if version >= 256:
        assert ini["MemoryZSwapWriteback"] == "no"
        assert ini["MemoryZSwapMax"] == str(64 << 20)
        bus = dict(p for u in sp.unit for p in u.bus())
        assert bus["MemoryZSwapWriteback"] is False


def _board(zswap: bool | None) -> BoardSwap:
    return BoardSwap(
        devices=(SwapDevice("/dev/zram0", "partition", 1 << 30, 256 << 20, 100),),
        zram=(ZramStat("zram0", 256 << 20, 64 << 20, 72 << 20),),
        zswap_enabled=zswap,
    )


def test_doctor_says_zram_memory_is_charged_to_no_slice() -> None:
    f = swap_finding(_board(False), (6, 1))
    assert f.level == "ok" and f.topic == "swap"
    assert "zram holds 72MiB of board memory for 256MiB stored, charged to no slice" in f.message


def test_doctor_warns_about_zswap_in_front_of_zram() -> None:
    f = swap_finding(_board(True), (6, 8))
    assert f.level == "warn" and "compresses every page twice" in f.message
    assert "zswap_writeback keeps it off the device" in f.message


def test_doctor_without_swap_says_swap_max_does_nothing() -> None:
    assert "swap_max has no effect" in swap_finding(BoardSwap(), (6, 1)).message


def test_doctor_says_swap_unknown_when_proc_swaps_failed_to_parse(tmp_path: Path) -> None:
    """An unreadable or unparsable /proc/swaps is not "no swap device" (issue 43, low)."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "swaps").write_text("Filename Type Size Used Priority\n/dev/sda2 ???\n")
    f = swap_finding(SwapReader(tmp_path / "proc", tmp_path / "sys").read(), (6, 1))
    assert f.level == "warn" and f.topic == "swap"
    assert f.message.startswith(f"swap unknown ({tmp_path}/proc/swaps: ")
    assert "no swap device" not in f.message
