"""Late memory-controller features found by a harmless write (governor/kernel/writeprobe.py,
issue 47): memory.peak reset (6.12) and memory.reclaim swappiness= (6.11), on a tmp cgroup
tree whose "kernel" refuses what an older kernel refuses (EINVAL for a word memory.reclaim does
not know; EACCES on a read-only memory.peak), and doctor's lines for each answer.
Needs: a tmp directory (no kernel)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from governor.compile.doctor import write_probe_findings
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs, translate
from governor.kernel.writeprobe import (
    PEAK_RESET_PROBE,
    RECLAIM_SWAPPINESS_PROBE,
    Probe,
    probe_peak_reset,
    probe_reclaim_swappiness,
)


class OldKernel(CgroupFs):
    """A 6.1 kernel's answers: memory.reclaim takes a size only, memory.peak has no write."""

    def write(self, cgroup: str, file: str, value: str) -> None:
        if file == kf.MEMORY_RECLAIM and " " in value.strip():
            err = OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            raise translate(err, "cannot write cgroup file", cgroup=cgroup, file=file) from err
        if file == kf.MEMORY_PEAK:
            err = OSError(errno.EACCES, os.strerror(errno.EACCES))
            raise translate(err, "cannot write cgroup file", cgroup=cgroup, file=file) from err
        super().write(cgroup, file, value)


def _tree(tmp_path: Path, *, own: str = "user.slice") -> Path:
    cg = tmp_path / "cg"
    (cg / own).mkdir(parents=True)
    (cg / kf.MEMORY_RECLAIM).write_text("")
    for f in (kf.MEMORY_PEAK, kf.MEMORY_RECLAIM):
        (cg / own / f).write_text("0\n")
    (cg / own / kf.MEMORY_PEAK).chmod(0o444)  # as the kernel makes it before 6.12
    return cg


def test_a_new_kernel_takes_both_writes_on_the_processs_own_group(tmp_path: Path) -> None:
    cg = _tree(tmp_path)
    (cg / "user.slice" / kf.MEMORY_PEAK).chmod(0o644)  # 6.12: peak_write
    fs = CgroupFs(cg)
    assert probe_peak_reset(fs, "user.slice") == Probe("yes", "/user.slice/memory.peak")
    assert (cg / "user.slice" / kf.MEMORY_PEAK).read_text() == PEAK_RESET_PROBE
    assert probe_reclaim_swappiness(fs, "user.slice") == Probe("yes", "/user.slice/memory.reclaim")
    assert (cg / "user.slice" / kf.MEMORY_RECLAIM).read_text() == RECLAIM_SWAPPINESS_PROBE


def test_an_old_kernel_refuses_both_and_doctor_names_the_fallbacks(tmp_path: Path) -> None:
    fs = OldKernel(_tree(tmp_path))
    peak = probe_peak_reset(fs, "user.slice")
    swappiness = probe_reclaim_swappiness(fs, "user.slice")
    assert peak == Probe("no", "/user.slice/memory.peak: read-only")
    assert swappiness == Probe("no", "/user.slice/memory.reclaim: EINVAL")
    got = {f.topic: f.message for f in write_probe_findings(peak, swappiness)}
    assert "needs kernel 6.12+" in got["kernel.memory_peak_reset"]
    assert (
        "a restart in the same group reports the highest of its runs"
        in got["kernel.memory_peak_reset"]
    )
    assert got["kernel.reclaim_swappiness"].endswith(
        "refused (/user.slice/memory.reclaim: EINVAL): memory.reclaim balances file and anon"
        " pages by vm.swappiness, the board's (a `reclaim N swappiness=S` action writes N alone"
        " there and says so)"
    )


def test_no_memory_controller_is_unknown_not_no(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    (cg / "init.scope").mkdir(parents=True)
    fs = CgroupFs(cg)
    assert probe_peak_reset(fs, "init.scope").verdict == "unknown"
    assert probe_reclaim_swappiness(fs, None).verdict == "unknown"
    # the root cgroup has no memory.peak: the first top-level group with one is tried
    (cg / "system.slice").mkdir()
    (cg / "system.slice" / kf.MEMORY_PEAK).write_text("0\n")
    assert probe_peak_reset(fs, None) == Probe("yes", "/system.slice/memory.peak")


def test_doctor_probes_an_explicit_cgroup_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`governor --cgroup-root TREE doctor`: the probes write into TREE, whatever the host."""
    from governor.cli.app import main

    cg = _tree(tmp_path, own="system.slice")
    for f in ("cgroup.controllers", "cgroup.subtree_control"):  # a cgroup2 mount to probe
        (cg / f).write_text("cpu io memory pids\n")
    with pytest.raises(SystemExit):
        main(["--cgroup-root", str(cg), "doctor"])
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "kernel.reclaim_swappiness" in ln)
    # this process's own group is not in TREE: the root's memory.reclaim is tried
    assert line.endswith("the kernel took a write (/memory.reclaim)")
    assert (cg / kf.MEMORY_RECLAIM).read_text() == RECLAIM_SWAPPINESS_PROBE
