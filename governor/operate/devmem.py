"""Device memory on the live board, for `governor status`, `top` and the metrics: what a
governed slice's processes hold in DRM and dma-buf memory (governor/kernel/devmem.py), and the
board's CMA and unaccounted memory (governor/backends/device.py). Reads; writes nothing."""

from __future__ import annotations

from typing import Any

from governor.backends.device import board_unaccounted, cma
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.devmem import DeviceMemoryReader, as_rows, total
from governor.kernel.procfs import ProcFs
from governor.plan.model import Plan
from governor.sizes import human_bytes


def device_memory(fs: CgroupFs, plan: Plan, proc: ProcFs | None = None) -> dict[str, Any]:
    """``{"rows": [{driver, region, bytes}], "total": bytes}`` of the slice now (no rows: no
    device memory seen, or the slice is gone)."""
    summary = DeviceMemoryReader(fs, proc or ProcFs()).group(plan.group)
    return {"rows": as_rows(summary), "total": total(summary)}


def board(
    fs: CgroupFs, plan: Plan, baseline: dict[str, int] | None, proc: ProcFs | None = None
) -> dict[str, Any]:
    """The board beside the slice: ``unaccounted`` since the engine started (None: no baseline,
    e.g. `governor apply`, or no memory controller), ``cma_total`` / ``cma_free`` (None
    without CONFIG_CMA)."""
    proc = proc or ProcFs()
    c = cma(proc)
    return {
        "unaccounted": board_unaccounted(baseline, fs, proc, plan.slice),
        "cma_total": c.get("CmaTotal"),
        "cma_free": c.get("CmaFree"),
    }


def device_board(
    fs: CgroupFs, plan: Plan, baseline: dict[str, int] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both, for one governed slice (status, metrics)."""
    return device_memory(fs, plan), board(fs, plan, baseline)


def render_device(item: dict[str, Any]) -> list[str]:
    """Status lines: the slice's device memory by driver/region, the board's CMA and
    unaccounted memory (only what was read)."""
    lines = []
    dev = item.get("device_memory")
    if dev and dev["rows"]:
        rows = "  ".join(
            f"{r['driver']}/{r['region']} {human_bytes(r['bytes'])}" for r in dev["rows"]
        )
        lines.append(
            f"  device   {rows}  (total {human_bytes(dev['total'])}; fdinfo, deduplicated)"
        )
    b = item.get("board") or {}
    said = []
    if b.get("unaccounted") is not None:
        said.append(
            f"unaccounted {human_bytes(b['unaccounted'])} since start (charged to no slice)"
        )
    if b.get("cma_total") is not None:
        said.append(f"CMA {human_bytes(b['cma_free'] or 0)} free of {human_bytes(b['cma_total'])}")
    if said:
        lines.append("  board    " + "  ".join(said))
    return lines
