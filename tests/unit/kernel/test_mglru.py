"""The multi-gen LRU's switches (governor/kernel/mglru.py) and doctor's word on them
(governor/compile/doctor.py mglru_finding): parsed from text as the kernel prints it and read
from a tmp /sys tree.

Needs: nothing (``0x0007`` as Debian's 6.18 prints it in the test guest, ``0x0000`` as its 6.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.compile.doctor import mglru_finding
from governor.kernel.mglru import (
    LRU_GEN_ENABLED,
    LRU_GEN_MIN_TTL_MS,
    Mglru,
    MglruReader,
    parse_enabled,
)


@pytest.mark.parametrize(
    ("text", "mask"),
    [("0x0007\n", 7), ("0x0000\n", 0), ("0x0001", 1), ("y\n", 1), ("n", 0), ("5", 5)],
)
def test_enabled_reads_the_kernels_hex_mask(text: str, mask: int) -> None:
    assert parse_enabled(text) == mask


def test_enabled_with_garbage_is_refused() -> None:
    with pytest.raises(ValueError, match="lru_gen enabled: unexpected 'on'"):
        parse_enabled("on\n")


def _sys(tmp_path: Path, enabled: str | None, ttl: str | None = "0\n") -> MglruReader:
    sys = tmp_path / "sys"
    if enabled is not None:
        (sys / LRU_GEN_ENABLED).parent.mkdir(parents=True)
        (sys / LRU_GEN_ENABLED).write_text(enabled)
        if ttl is not None:
            (sys / LRU_GEN_MIN_TTL_MS).write_text(ttl)
    return MglruReader(sys)


def test_reader_on_off_and_absent(tmp_path: Path) -> None:
    on = _sys(tmp_path / "a", "0x0007\n", "1000\n").read()
    assert (on.built, on.on, on.enabled, on.min_ttl_ms) == (True, True, 7, 1000)
    off = _sys(tmp_path / "b", "0x0000\n").read()
    assert (off.built, off.on, off.min_ttl_ms) == (True, False, 0)
    # only the page-table bits, without the main switch: off
    assert not _sys(tmp_path / "c", "0x0006\n").read().on
    assert _sys(tmp_path / "d", None).read() == Mglru()
    bad = _sys(tmp_path / "e", "what\n").read()
    assert bad.built and not bad.on and bad.error is not None and "unexpected 'what'" in bad.error
    assert _sys(tmp_path / "f", "0x0007\n", None).read().min_ttl_ms is None


def test_doctor_mglru_off_or_absent_is_the_lru_the_refaults_rule_knows() -> None:
    for lru in (Mglru(), Mglru(built=True, enabled=0, min_ttl_ms=0)):
        f = mglru_finding(lru)
        assert f.level == "ok" and f.topic == "mglru"
        assert "the active/inactive LRU the refaults rule was tuned on" in f.message
    assert (
        "built but off (/sys/kernel/mm/lru_gen/enabled 0x0000)"
        in mglru_finding(Mglru(built=True, enabled=0, min_ttl_ms=0)).message
    )


def test_doctor_mglru_on_says_the_refaults_rule_was_tuned_elsewhere() -> None:
    f = mglru_finding(Mglru(built=True, enabled=7, min_ttl_ms=0))
    assert f.level == "ok"
    assert f.message.startswith("multi-gen LRU on (0x0007), min_ttl_ms 0: no working set")
    assert "refaults threshold measured on another kernel" in f.message


def test_doctor_warns_that_min_ttl_turns_thrash_into_a_kill() -> None:
    f = mglru_finding(Mglru(built=True, enabled=7, min_ttl_ms=1000))
    assert f.level == "warn"
    assert "keeps the last 1000 ms of every working set and OOM-kills" in f.message
    assert f.fix is not None and f.fix.startswith("echo 0 > /sys/kernel/mm/lru_gen/min_ttl_ms")


def test_doctor_mglru_unreadable_is_unknown_not_absent() -> None:
    f = mglru_finding(Mglru(built=True, error="/sys/kernel/mm/lru_gen/enabled: Permission denied"))
    assert f.level == "warn" and f.message.startswith("multi-gen LRU unknown (")
