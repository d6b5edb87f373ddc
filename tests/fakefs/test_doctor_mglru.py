"""`governor --root TREE doctor` reports the multi-gen LRU (issue 47): the RK3588 fixture tree
with and without /sys/kernel/mm/lru_gen, as Debian's 6.18 (on, 0x0007), 6.1 (off) and 5.10 (not
built) have it. Needs: a tmp directory (no kernel)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from governor.cli.app import main
from governor.kernel.mglru import LRU_GEN_ENABLED, LRU_GEN_MIN_TTL_MS

RK3588 = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "rk3588"


def _doctor(capsys: pytest.CaptureFixture[str], root: Path) -> dict[str, dict[str, str]]:
    with pytest.raises(SystemExit) as info:
        main(["--root", str(root), "doctor", "--json"])
    assert info.value.code == 0
    found = json.loads(capsys.readouterr().out)["findings"]
    return {f["topic"]: f for f in found}


def _board(tmp_path: Path, enabled: str | None, ttl: str = "0\n") -> Path:
    root = tmp_path / "root"
    shutil.copytree(RK3588, root, symlinks=True)
    if enabled is not None:
        lru = root / "sys" / LRU_GEN_ENABLED
        lru.parent.mkdir(parents=True)
        lru.write_text(enabled)
        (root / "sys" / LRU_GEN_MIN_TTL_MS).write_text(ttl)
    return root


def test_doctor_reports_mglru_on_with_min_ttl_as_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _doctor(capsys, _board(tmp_path, "0x0007\n", "1000\n"))["mglru"]
    assert f["level"] == "warn"
    assert f["message"].startswith("multi-gen LRU on (0x0007), min_ttl_ms 1000: ")
    assert "echo 0 > /sys/kernel/mm/lru_gen/min_ttl_ms" in f["fix"]


def test_doctor_reports_mglru_on_off_and_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    on = _doctor(capsys, _board(tmp_path / "on", "0x0007\n"))["mglru"]
    assert (on["level"], on["message"][:40]) == ("ok", "multi-gen LRU on (0x0007), min_ttl_ms 0:")
    off = _doctor(capsys, _board(tmp_path / "off", "0x0000\n"))["mglru"]
    assert off["message"].startswith("multi-gen LRU built but off")
    none = _doctor(capsys, _board(tmp_path / "none", None))["mglru"]
    assert none["message"].startswith("no multi-gen LRU in this kernel")
