"""perf/qos.py's pure parts, shared by the command line (perf/qos.py) and the runs in the
guest (perf/qos_guest.py): the constants, the chat's step log, speeds, stall seconds, the solo
baseline, the OOM victims, the bench policies and the tables. Both import this module and it
imports neither, so the two have no import circle."""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "helpers"
ARMS = ("bare", "governor", "gov+shed", "oomd", "earlyoom", "cpu-only")
WINDOW_FROM_S = 20.0  # the background job starts this long after the chat is ready
SLOW_FACTOR = 4.0  # a step slower than this x the solo median step is a stall
CHAT_COMM, BG_COMM = "qos-chat", "qos-batch"
KV_END_MIB = 550  # the chat's KV cache at its end (kvchat.py's default --kv-end)
MIB = 1 << 20


# ------------------------------------------------------------------------------ pure parts


@dataclass
class Chat:
    """The chat's --out file: its ready time and (time, KV MiB) of each step."""

    t0: float | None = None
    steps: list[tuple[float, int]] = field(default_factory=list)
    done: int | None = None


def parse_chat(text: str) -> Chat:
    chat = Chat()
    for line in text.splitlines():
        parts = line.split()
        with contextlib.suppress(IndexError, ValueError):
            if parts[0] == "ready":
                chat.t0 = float(parts[1])
            elif parts[0] == "step":
                chat.steps.append((float(parts[1]), int(parts[2])))
            elif parts[0] == "done":
                chat.done = int(parts[1])
    return chat


def step_speed(times: Sequence[float], start: float, end: float) -> float:
    """Steps completed in (start, end] per second; a chat that died early scores 0 for the rest."""
    if end <= start:
        return 0.0
    return sum(1 for t in times if start < t <= end) / (end - start)


def step_durations(times: Sequence[float], start: float) -> list[float]:
    """Durations of the steps that ended after `start` (each from the previous step's end)."""
    return [b - a for a, b in itertools.pairwise(times) if b > start]


def slow_seconds(durations: Sequence[float], solo_median: float, factor: float) -> float:
    """Time spent in steps slower than factor x the solo median step."""
    return sum(d for d in durations if d > factor * solo_median)


def solo_around(solos: Sequence[tuple[int, float]], seq: int) -> float | None:
    """Mean speed of the solo runs just before and just after run number `seq` (one of them if
    the other is missing)."""
    before = [s for i, s in solos if i < seq]
    after = [s for i, s in solos if i > seq]
    near = before[-1:] + after[:1]
    return statistics.fmean(near) if near else None


def oom_victims(kmsg: str) -> list[str]:
    """Process names the kernel's OOM killer killed ("Killed process PID (NAME)")."""
    out = []
    for line in kmsg.splitlines():
        if "Killed process" in line and "(" in line:
            out.append(line.split("(", 1)[1].split(")", 1)[0])
    return out


def earlyoom_kills(log_text: str) -> list[str]:
    """earlyoom's own kill lines, as "earlyoom SIGNAL: NAME" ('sending SIGTERM to process 123
    uid 0 "qos-batch": ...')."""
    out = []
    for line in log_text.splitlines():
        if line.startswith("sending") and '"' in line:
            sig, name = line.split()[1], line.split('"')[1]
            out.append(f"earlyoom {sig}: {name}")
    return out


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


def guest_cpu(shipped: dict[str, Any], ncpus: int) -> dict[str, Any]:
    """The policy's [cpu] for the guest, whose CPUs all report one capacity: "big" is the upper
    half of its CPUs and "little" the lower half (a 4+4 RK3588's clusters, in small); with one
    CPU no pinning. Its weight and max as shipped."""
    cpu = dict(shipped.get("cpu", {}))
    half = ncpus // 2
    spans = {"big": (half, ncpus - 1), "little": (0, half - 1)}
    if cpu.get("cpus") in spans and half >= 1:
        lo, hi = spans[cpu["cpus"]]
        cpu["cpus"] = str(lo) if lo == hi else f"{lo}-{hi}"
    elif cpu.get("cpus") in spans:
        del cpu["cpus"]
    return cpu


def bench_policy(
    shipped: dict[str, Any],
    name: str,
    slice_: str,
    memory: dict[str, str],
    *,
    shed: bool,
    ncpus: int,
) -> str:
    """A bench policy from a shipped one: its [qos], [cpu] (guest_cpu), oom_score_adj, nice and
    memory and cpu rules (never the io ones), `memory` instead of its [memory]; without `shed`,
    the rules that shed are left out."""
    lines = [f"name = {toml_value(name)}", f"slice = {toml_value(slice_)}", "", "[memory]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in memory.items()]
    if cpu := guest_cpu(shipped, ncpus):
        lines += ["", "[cpu]"] + [f"{k} = {toml_value(v)}" for k, v in cpu.items()]
    process = {
        k: v for k, v in shipped.get("process", {}).items() if k in ("oom_score_adj", "nice")
    }
    if process:
        lines += ["", "[process]"] + [f"{k} = {toml_value(v)}" for k, v in process.items()]
    if "qos" in shipped:
        lines += ["", "[qos]"] + [f"{k} = {toml_value(v)}" for k, v in shipped["qos"].items()]
    for rule in shipped.get("pressure", []):
        words = " ".join([rule["when"], *rule["do"]])
        if " io " in f" {words} " or (not shed and "shed" in rule["do"]):
            continue
        lines += ["", "[[pressure]]"] + [f"{k} = {toml_value(v)}" for k, v in rule.items()]
    return "\n".join(lines) + "\n"


@dataclass
class Run:
    arm: str
    seq: int
    speed: float = 0.0  # chat steps/s from t = 20 s to its end
    ratio: float | None = None  # speed / the solo runs around it
    full_s: float | None = None  # the chat cgroup's memory.pressure full over the window
    slow_s: float | None = None  # time in steps slower than SLOW_FACTOR x the solo median
    chat_rc: int | None = None
    bg_rc: int | None = None
    bg_done: bool = False
    # CPU over the window (t = 20 s to the chat's end): the chat's user and system seconds, its
    # run-queue wait (runnable while something else ran on its CPU), kswapd0's user + system
    chat_user_s: float | None = None
    chat_sys_s: float | None = None
    chat_wait_s: float | None = None
    kswapd_s: float | None = None
    window_s: float = 0.0  # the measured window's length (t = 20 s to the chat's end)
    kills: list[str] = field(default_factory=list)  # who killed whom
    actions: list[str] = field(default_factory=list)  # the governors' actions, shed steps
    durations: list[float] = field(default_factory=list)


def _fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def col(vals: Sequence[float | None], nd: int) -> str:
    """A table cell: the median of the runs' values, then each run's in brackets."""
    got = [v for v in vals if v is not None]
    med = _fmt(statistics.median(got), nd) if got else "-"
    return f"{med} ({' / '.join(_fmt(v, nd) for v in vals)})"


def table(runs: Sequence[Run], solos: Sequence[Run]) -> str:
    """Markdown: per arm the median over its runs and each run in brackets."""
    lines = [
        f"solo speed (steps/s, t >= 20 s): {' '.join(_fmt(s.speed) for s in solos)}",
        "",
        "| arm | speed vs solo | stall full (s) | stall slow steps (s) | kills | "
        "background completed | actions |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        rs = [r for r in runs if r.arm == arm]
        if not rs:
            continue

        kinds = sorted({k for r in rs for k in r.kills})
        kills = "; ".join(f"{k} ({sum(k in r.kills for r in rs)}/{len(rs)})" for k in kinds)
        done = f"{sum(r.bg_done for r in rs)} of {len(rs)}"
        acts = "; ".join(sorted({a for r in rs for a in r.actions})) or "-"
        lines.append(
            f"| {arm} | {col([r.ratio for r in rs], 2)}x | {col([r.full_s for r in rs], 1)} | "
            f"{col([r.slow_s for r in rs], 1)} | {kills or 'none'} | {done} | {acts} |"
        )
    return "\n".join(lines)


def step_cpu_ms(run: Run) -> float | None:
    """The chat's CPU (user + system) per step over the window, in ms: more than alone means
    each step cost the emulated CPU more, not that the chat waited."""
    steps = run.speed * run.window_s
    if run.chat_user_s is None or run.chat_sys_s is None or steps <= 0:
        return None
    return (run.chat_user_s + run.chat_sys_s) / steps * 1000


def cpu_table(runs: Sequence[Run], solos: Sequence[Run]) -> str:
    """Markdown: per arm (solo first) the median CPU seconds over the window, each run's in
    brackets: where the chat's time went when it was slower than alone."""
    lines = [
        "| arm | chat user (s) | chat system (s) | chat run-queue wait (s) | kswapd0 (s) | "
        "chat CPU per step (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for arm in ("solo", *ARMS):
        rs = [r for r in [*solos, *runs] if r.arm == arm]
        if not rs:
            continue
        cols = [
            col(vals, 1)
            for vals in (
                [r.chat_user_s for r in rs], [r.chat_sys_s for r in rs],
                [r.chat_wait_s for r in rs], [r.kswapd_s for r in rs],
                [step_cpu_ms(r) for r in rs],
            )
        ]  # fmt: skip
        lines.append(f"| {arm} | " + " | ".join(cols) + " |")
    return "\n".join(lines)
