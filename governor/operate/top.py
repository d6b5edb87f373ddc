"""`governor top`: a live view, one row per governed slice, refreshed every DELAY seconds.

Columns: memory current / memory.high / memory.max (current as % of high), anon / file,
memory PSI some / full avg10, CPU % (of one CPU, over the last interval), throttled %,
memory.events high / max / oom_kill since the previous frame, the [qos] class (int, std, bg)
and the rules' states (after "SHED frozen by npu-chat" while a higher class's shed holds it);
under a llama-server router's row, a row per model leaf (memory.current, memory.max, loaded,
its estimate, oom_kill); under the rows, the board's budget and claims (issue 36, `governor
board`).
Keys (interactive): ``m`` sort by memory, ``p`` by pressure, ``c`` by CPU, ``q`` quit.
``-b/--batch`` prints plain frames (systemd-cgtop's convention), ``-n N`` stops after N.
"""

from __future__ import annotations

import curses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from governor.operate.status import ago, collect
from governor.sizes import human_bytes

SORT_KEYS = {"m": "memory", "p": "pressure", "c": "cpu"}
HEADER = (
    f"{'SLICE':<16}{'MEM':>9}{'HIGH':>9}{'MAX':>9}{'%HIGH':>7}{'ANON':>9}{'FILE':>9}{'DEV':>9}"
    f"{'PSI-S':>7}{'PSI-F':>7}{'CPU%':>7}{'THR%':>6}{'EV-H':>6}{'EV-M':>6}{'OOMK':>6}  QOS  RULES"
)


def _size(v: int | None) -> str:
    return "-" if v is None else human_bytes(v)


def _knob(item: dict[str, Any], file: str) -> int | None:
    for k in item["knobs"]:
        if k["file"] == file and k["kernel"] not in (None, "max"):
            return int(k["kernel"].split()[0])
    return None


class Frame:
    """Rows from two successive status snapshots (deltas need the previous one)."""

    def __init__(self) -> None:
        self.previous: dict[str, tuple[float, dict[str, Any]]] = {}

    def rows(self, items: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        out = []
        for it in items:
            usage = it["usage"] or {}
            mem = usage.get("memory", {})
            psi = usage.get("pressure", {}).get("memory")
            cpu = usage.get("cpu", {})
            events = usage.get("memory_events", {})
            row: dict[str, Any] = {
                "name": it["policy"],
                "state": it["state"],
                "budget": it.get("budget"),
                "current": mem.get("current"),
                "high": _knob(it, "memory.high"),
                "max": _knob(it, "memory.max"),
                "anon": mem.get("anon"),
                "file": mem.get("file"),
                "device": (it.get("device_memory") or {}).get("total"),  # DRM + dma-buf
                "psi_some": psi["some"]["avg10"] if psi else None,
                "psi_full": psi["full"]["avg10"] if psi and psi["full"] else None,
                "cpu": None,
                "throttled": None,
                "events": dict.fromkeys(("high", "max", "oom_kill"), 0),
                "rules": _rules(it["rules"]),
                "qos": (it.get("qos") or {}).get("class", "standard"),
                "shed": it.get("shed"),
                "models": it.get("models") or [],  # llama-server's router: its model leaves
            }
            before = self.previous.get(it["policy"])
            if before is not None:
                t0, old = before
                dt = max(now - t0, 1e-6)
                old_cpu = (old.get("usage") or {}).get("cpu", {})
                for key, src in (("cpu", "usage_usec"), ("throttled", "throttled_usec")):
                    if cpu.get(src) is not None and old_cpu.get(src) is not None:
                        row[key] = (cpu[src] - old_cpu[src]) / 1e6 / dt * 100
                old_events = (old.get("usage") or {}).get("memory_events", {})
                for key in row["events"]:
                    row["events"][key] = events.get(key, 0) - old_events.get(key, 0)
            self.previous[it["policy"]] = (now, it)
            out.append(row)
        return out


def _rules(rules: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for r in rules:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    return ", ".join(f"{n} {state}" for state, n in counts.items()) or "-"


def sort_rows(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    def value(r: dict[str, Any]) -> float:
        v = {"memory": r["current"], "pressure": r["psi_some"], "cpu": r["cpu"]}[key]
        return -(v or 0)

    return sorted(rows, key=value)


def format_row(r: dict[str, Any]) -> str:
    pct = f"{r['current'] / r['high'] * 100:.0f}" if r["current"] and r["high"] else "-"

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    ev = r["events"]
    name = r["name"] if r["state"] == "running" else f"{r['name']}({r['state']})"
    return (
        f"{name[:15]:<16}{_size(r['current']):>9}{_size(r['high']):>9}{_size(r['max']):>9}"
        f"{pct:>7}{_size(r['anon']):>9}{_size(r['file']):>9}{_size(r.get('device')):>9}"
        f"{num(r['psi_some']):>7}"
        f"{num(r['psi_full']):>7}{num(r['cpu']):>7}{num(r['throttled']):>6}"
        f"{ev['high']:>6}{ev['max']:>6}{ev['oom_kill']:>6}  {_QOS.get(r['qos'], '?'):<5}"
        + (f"SHED {r['shed']['state']} by {r['shed']['by']}; " if r.get("shed") else "")
        + str(r["rules"])
    )


def model_row(m: dict[str, Any]) -> str:
    """One model leaf of llama-server's router, under its slice's row (MEM and MAX columns)."""
    return (
        f"  {m['model'][:13]:<14}{_size(m['memory_current']):>9}{'':>9}"
        f"{_size(m['memory_max']):>9}  {'loaded' if m['loaded'] else 'unloaded'},"
        f" estimate {_size(m['estimate'])}, oom_kill {m['oom_kill']},"
        f" last request {ago(m.get('last_request_s'))}"
    )


_QOS = {"interactive": "int", "standard": "std", "background": "bg"}


def frame_text(rows: list[dict[str, Any]], key: str, now: float) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    lines = [f"governor top - {stamp} - {len(rows)} slice(s), sorted by {key}", HEADER]
    for r in sort_rows(rows, key):
        lines.append(format_row(r))
        lines += [model_row(m) for m in r.get("models", ())]
    if len(lines) == 2:
        lines.append("(no governed slices)")
    if rows and rows[0].get("budget"):  # the board's claims, as `governor board` shows them
        lines.append(board_line(rows[0]["budget"]))
    return "\n".join(lines) + "\n"


def board_line(b: dict[str, Any]) -> str:
    return (
        f"board: budget {_size(b['budget'])}, claimed {_size(b['claimed']['min'])} min /"
        f" {_size(b['claimed']['peak'])} peak, free {_signed(b['free']['guarantees'])} for"
        f" guarantees / {_signed(b['free']['peaks'])} for peaks"
    )


def _signed(n: int) -> str:
    return f"-{_size(-n)}" if n < 0 else _size(n)


def batch(
    run: Path,
    *,
    delay: float,
    iterations: int | None,
    key: str = "memory",
    out: Callable[[str], object] | None = None,  # sys.stdout.write at the call, not import
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    out = out or sys.stdout.write
    frame = Frame()
    n = 0
    while iterations is None or n < iterations:
        if n:
            sleep(delay)
        now = time.time()
        out(frame_text(frame.rows(collect(run, now=now), now), key, now) + "\n")
        sys.stdout.flush()
        n += 1


def interactive(
    run: Path, *, delay: float, iterations: int | None
) -> None:  # pragma: no cover - tmux test in the guest

    def loop(screen: Any) -> None:
        curses.curs_set(0)
        screen.timeout(int(delay * 1000))
        frame = Frame()
        key = "memory"
        n = 0
        while iterations is None or n < iterations:
            now = time.time()
            text = frame_text(frame.rows(collect(run, now=now), now), key, now)
            screen.erase()
            height, width = screen.getmaxyx()
            for y, line in enumerate(text.splitlines()[: height - 1]):
                screen.addnstr(y, 0, line, width - 1)
            screen.addnstr(height - 1, 0, "m memory  p pressure  c cpu  q quit", width - 1)
            screen.refresh()
            n += 1
            ch = screen.getch()
            if ch in (ord("q"), ord("Q")):
                return
            if ch != -1 and chr(ch) in SORT_KEYS:
                key = SORT_KEYS[chr(ch)]

    curses.wrapper(loop)
