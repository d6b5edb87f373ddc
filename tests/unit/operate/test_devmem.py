"""Device memory and the board on the live board (governor/operate/devmem.py): what status,
top and the metrics read, on a tmp cgroup tree and a tmp /proc. Needs: nothing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from governor.backends.device import board_baseline
from governor.compile.compiler import compile_plan
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.operate.devmem import board, device_memory, render_device
from governor.operate.top import Frame, format_row
from governor.plan.host import probe
from governor.plan.model import Plan
from governor.policy.loader import load_text

REPO = Path(__file__).resolve().parents[3]
RK3588 = REPO / "tests" / "fixtures" / "hosts" / "rk3588"
MIB = 1 << 20
DMABUF = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t{ino}\nsize:\t{size}\ncount:\t1\nexp_name:\tdrm\n"
PANTHOR = "drm-driver:\tpanthor\ndrm-client-id:\t3\ndrm-total-memory:\t16480 KiB\n"


def _setup(tmp_path: Path) -> tuple[CgroupFs, ProcFs, Plan]:
    plan = compile_plan(
        load_text('name = "npu"\n', source="npu.toml"),
        probe(RK3588, target="governor.slice/npu"),
    )
    cg = tmp_path / "cg"
    (cg / "governor.slice" / "npu" / "engine").mkdir(parents=True)
    (cg / "governor.slice" / "memory.current").write_text(f"{100 * MIB}\n")
    (cg / "governor.slice" / "npu" / "cgroup.procs").write_text("")
    (cg / "governor.slice" / "npu" / "engine" / "cgroup.procs").write_text("7\n8\n")
    proc = tmp_path / "proc"
    shutil.copytree(RK3588 / "proc", proc)
    for pid, files in {7: [DMABUF.format(ino=1, size=8 * MIB), PANTHOR], 8: [PANTHOR]}.items():
        (proc / str(pid) / "fdinfo").mkdir(parents=True)
        for fd, text in enumerate(files, 3):
            (proc / str(pid) / "fdinfo" / str(fd)).write_text(text)
    return CgroupFs(cg), ProcFs(proc), plan


def test_status_device_lines_and_board_figures(tmp_path: Path) -> None:
    fs, proc, plan = _setup(tmp_path)
    dev = device_memory(fs, plan, proc)
    assert dev["rows"] == [
        {"driver": "drm", "region": "dma-buf", "bytes": 8 * MIB},
        {"driver": "panthor", "region": "memory", "bytes": 16480 << 10},
    ]
    assert dev["total"] == 16480 << 10  # the PRIME export is in panthor's drm-total
    base = board_baseline(fs, proc, plan.slice)
    assert base is not None
    # the board then loses 300 MiB more, of which the slice was charged 100 MiB
    meminfo = proc.path("meminfo")
    avail = proc.meminfo()["MemAvailable"] // 1024
    meminfo.write_text(
        meminfo.read_text().replace(
            f"MemAvailable:    {avail} kB", f"MemAvailable:    {avail - 300 * 1024} kB"
        )
    )
    (fs.path(plan.slice) / "memory.current").write_text(f"{200 * MIB}\n")
    b = board(fs, plan, base, proc)
    assert b == {"unaccounted": 200 * MIB, "cma_total": 256 * MIB, "cma_free": 226 * MIB}
    assert board(fs, plan, None, proc)["unaccounted"] is None  # apply: no baseline
    lines = render_device({"device_memory": dev, "board": b})
    assert lines[0].startswith("  device   drm/dma-buf 8MiB  panthor/memory 16.09MiB")
    assert "unaccounted 200MiB since start" in lines[1] and "CMA 226MiB free of 256MiB" in lines[1]
    assert render_device({"device_memory": {"rows": [], "total": 0}, "board": {}}) == []


def test_top_shows_the_device_total(tmp_path: Path) -> None:
    fs, proc, plan = _setup(tmp_path)
    item: dict[str, Any] = {
        "policy": "npu", "state": "running", "usage": None, "knobs": [], "rules": [],
        "device_memory": device_memory(fs, plan, proc),
    }  # fmt: skip
    (row,) = Frame().rows([item], now=0.0)
    assert row["device"] == 16480 << 10
    assert "16.09MiB" in format_row(row)
