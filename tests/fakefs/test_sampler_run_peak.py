"""The sampler's per-run peak (governor/monitor/sampler.py, issue 47): memory.peak reset
(6.12) through an fd the sampler keeps, started on the first sample and again at a restart; a
kernel that refuses the write (memory.peak read-only before 6.12) leaves ``run_peak`` None and
the group's peak as it was. Needs: a tmp directory (no kernel)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs, translate
from governor.kernel.writeprobe import PEAK_RESET_PROBE
from governor.monitor.sampler import Sampler

MIB = 1 << 20


def _group(tmp_path: Path) -> Path:
    g = tmp_path / "cg" / "chat"
    g.mkdir(parents=True)
    (g / kf.MEMORY_CURRENT).write_text(f"{10 * MIB}\n")
    (g / kf.MEMORY_PEAK).write_text(f"{300 * MIB}\n")
    (g / kf.MEMORY_STAT).write_text("anon 0\nfile 0\n")
    return g


def _kset(path: Path, text: str) -> None:
    """What the kernel shows through the sampler's reset fd next (same inode, in place)."""
    with path.open("r+") as f:
        f.truncate(0)
        f.write(text)


def test_run_peak_is_read_through_the_reset_fd_and_reset_again_at_a_restart(
    tmp_path: Path,
) -> None:
    g = _group(tmp_path)
    s = Sampler(CgroupFs(tmp_path / "cg"), "chat")
    # the first sample starts the run's peak: the kernel took the write
    first = s.sample(1.0)
    assert (g / kf.MEMORY_PEAK).read_text().startswith(PEAK_RESET_PROBE.strip())
    assert first.run_peak is None  # a plain file shows the written word: not a number
    _kset(g / kf.MEMORY_PEAK, f"{120 * MIB}\n")
    assert s.sample(2.0).run_peak == 120 * MIB
    assert s.reset_peak() is True  # a restart: a new fd
    _kset(g / kf.MEMORY_PEAK, f"{40 * MIB}\n")
    assert s.sample(3.0).run_peak == 40 * MIB
    assert s.summary()["run_peak"] == 40 * MIB
    s.close()


class Before612(CgroupFs):
    """memory.peak without a write handler: the open for writing fails with EACCES."""

    def open_reset(self, cgroup: str, file: str, text: str) -> int:
        err = OSError(errno.EACCES, os.strerror(errno.EACCES))
        raise translate(err, "cannot open cgroup file", cgroup=cgroup, file=file) from err


def test_without_the_reset_run_peak_is_none_and_the_groups_peak_stays(tmp_path: Path) -> None:
    g = _group(tmp_path)
    s = Sampler(Before612(tmp_path / "cg"), "chat")
    got = s.sample(1.0)
    assert (got.peak, got.run_peak) == (300 * MIB, None)
    assert (g / kf.MEMORY_PEAK).read_text() == f"{300 * MIB}\n"  # nothing written
    assert s.reset_peak() is False
    assert s.summary()["run_peak"] is None
    s.close()


def test_a_restart_resets_the_monitors_run_peak(tmp_path: Path) -> None:
    """The supervisor's restart hook starts the new run's peak (issue 47)."""
    from types import SimpleNamespace

    from governor.backends.cgroupfs import CgroupfsBackend
    from governor.kernel.procfs import ProcFs
    from governor.launch.launcher import ChildSetup, Launcher
    from governor.supervise.supervisor import Job, Supervisor

    from .plans import make_plan

    g = _group(tmp_path)
    fs = CgroupFs(tmp_path / "cg")
    s = Sampler(fs, "chat")
    s.sample(1.0)
    sup = Supervisor(CgroupfsBackend(fs), Launcher(fs), proc=ProcFs(), watchdog=None)
    sup.monitor = SimpleNamespace(sampler=s)  # type: ignore[assignment]  # only its sampler
    setup = ChildSetup(executable="/bin/true", argv=("/bin/true",), env={}, pdeathsig=False)
    _kset(g / kf.MEMORY_PEAK, "0\n")
    sup._restarted(Job(plan=make_plan(), setup=setup), 4242)
    assert (g / kf.MEMORY_PEAK).read_text() == PEAK_RESET_PROBE  # a second write, a new fd
    s.close()
