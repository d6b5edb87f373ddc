"""perf/qos's real-engine benchmark, its pure parts (issue 48): a run's record, the per-turn
numbers of the chat, the aggregation per swap setup and arm (the ratio to solo, its median and
its WORST round, TTFT p50/p95, kills, the job's completion time, the weights re-read), and the
writers: CSV (one row a run), JSON (runs + summary + what the run was) and PNG plots
(matplotlib, the `plot` extra). The guest side is perf/qos_real_guest.py, the command line
perf/qos_real.py; this module does no I/O but the writers'."""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from perf.qos_common import solo_around

SWAPS = ("none", "zram", "zswap")
REAL_ARMS = ("bare", "earlyoom", "oomd", "governor")
# the floor, not in the default matrix: the job beside the chat without the hog, no limits (what
# sharing the board's 2 vCPUs with the batch engine costs the chat when memory is no question)
FLOOR_ARM = "cpu-only"
ARMS = (*REAL_ARMS, FLOOR_ARM)  # every arm --arms takes, in the report's order
LOW_RATIO = 0.95  # a round below this x solo is one the report has to explain (issue 48)


@dataclass
class Turn:
    """One chat turn: seconds to the first streamed token, then the rest of the answer."""

    ttft_s: float
    tokens: int  # completion tokens
    seconds: float  # request to the last chunk

    @property
    def decode_s(self) -> float:
        return max(0.0, self.seconds - self.ttft_s)


def decode_tps(turns: Sequence[Turn]) -> float:
    """Tokens after the first per second of decoding, over all turns (a stalled turn weighs its
    full length, as a user waits through it); 0 without any."""
    toks = sum(max(0, t.tokens - 1) for t in turns)
    secs = sum(t.decode_s for t in turns)
    return toks / secs if secs > 0 else 0.0


@dataclass
class RealRun:
    swap: str
    arm: str  # "solo": the chat alone, bare
    round: int
    seq: int  # order within its swap setup (solo baselines are interleaved by it)
    tps: float = 0.0  # decode tokens/s of the measured turns (decode_tps)
    ratio: float | None = None  # tps / the solo runs around it
    ttfts: list[float] = field(default_factory=list)
    turns: int = 0
    chat_rc: int | None = None
    job_rc: int | None = None
    job_s: float | None = None  # the batch generation's start to exit 0; None: it did not finish
    hog_rc: int | None = None
    refault_file: int | None = None  # the chat cgroup's workingset_refault_file over the window
    full_s: float | None = None  # the chat cgroup's memory.pressure `full` over the window
    kills: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    error: str | None = None
    wall_s: float | None = None  # the run's seconds, the chat's start to its teardown
    # where wall_s went (PHASES: seconds each, in order): what an arm-round costs
    phases: dict[str, float] = field(default_factory=dict)
    # where the guest's CPUs went over the window (CPU_USERS: seconds each): the chat, the job
    # and the hog by their processes, the governor's supervisors, the guest's idle time; the
    # rest is the bench's client and the system's. A round below LOW_RATIO says why by it
    cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def oom_kills(self) -> int:
        return len(self.kills)


# a run's phases, in order: the chat's start to /health 200 (the model's load under TCG), the
# warm-up turn, the measured window (its last turn ends past --chat-s), the wait for the job
# after it (--job-wait at most), the teardown (SIGTERM, the governors' exit, the kill count)
PHASES = ("up", "warm", "window", "job_wait", "teardown")
CPU_USERS = ("chat", "job", "hog", "governor", "idle")


def percentile(vals: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default)."""
    if not vals:
        return None
    xs = sorted(vals)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def assign_ratios(runs: Sequence[RealRun]) -> None:
    """Each arm run's ratio: its tokens/s over the mean of the solo runs just before and after
    it in the same swap setup (TCG's speed drifts within a boot)."""
    for swap in {r.swap for r in runs}:
        mine = [r for r in runs if r.swap == swap]
        solos = [(r.seq, r.tps) for r in mine if r.arm == "solo" and r.tps > 0]
        for r in mine:
            if r.arm == "solo":
                continue
            base = solo_around(solos, r.seq)
            r.ratio = r.tps / base if base else None


@dataclass
class Row:
    """One swap setup x arm over its rounds."""

    swap: str
    arm: str
    rounds: int
    ratio_median: float | None
    ratio_worst: float | None
    ttft_p50: float | None
    ttft_p95: float | None
    oom_kills: int
    kills: str
    job_done: int
    job_exits: str  # the job's exit statuses of the rounds it did not finish ("143", "-": none)
    job_s_median: float | None
    refault_median: float | None
    low_rounds: int  # rounds below LOW_RATIO
    turns_fewest: int  # the fewest measured turns of a round (1: its ratio is one turn's)


def _median(vals: Sequence[float | None]) -> float | None:
    got = [v for v in vals if v is not None]
    return statistics.median(got) if got else None


def summarise(runs: Sequence[RealRun]) -> list[Row]:
    """Per swap setup (SWAPS order) and arm (solo first, then ARMS order)."""
    rows = []
    for swap in [s for s in SWAPS if any(r.swap == s for r in runs)]:
        for arm in ("solo", *ARMS):
            rs = [r for r in runs if r.swap == swap and r.arm == arm]
            if not rs:
                continue
            ratios = [r.ratio for r in rs if r.ratio is not None]
            ttfts = [t for r in rs for t in r.ttfts]
            kinds = sorted({k for r in rs for k in r.kills})
            rows.append(
                Row(
                    swap=swap, arm=arm, rounds=len(rs),
                    ratio_median=statistics.median(ratios) if ratios else None,
                    ratio_worst=min(ratios) if ratios else None,
                    ttft_p50=percentile(ttfts, 50), ttft_p95=percentile(ttfts, 95),
                    oom_kills=sum(r.oom_kills for r in rs),
                    kills="; ".join(kinds),
                    job_done=sum(r.job_s is not None for r in rs),
                    job_exits=",".join(sorted({"-" if r.job_rc is None else str(r.job_rc)
                                               for r in rs if r.job_s is None})),
                    job_s_median=_median([r.job_s for r in rs]),
                    refault_median=_median([r.refault_file for r in rs]),
                    low_rounds=sum(x < LOW_RATIO for x in ratios),
                    turns_fewest=min(r.turns for r in rs),
                )
            )  # fmt: skip
    return rows


@dataclass
class Cost:
    """What the runs of one boot cost: the median seconds of each phase (PHASES) per kind of run
    (solo, an arm), a run's median wall seconds, and the projected seconds of a matrix."""

    phases: dict[str, dict[str, float]]  # kind -> phase -> median seconds
    solo_s: float  # a solo run's median wall_s
    arm_s: float  # an arm run's median wall_s (every arm's runs together)
    setup_s: float  # a swap setup's median seconds before its first run (swap on, two inits)


def cost(runs: Sequence[RealRun], setup_s: Sequence[float]) -> Cost | None:
    """The phases and per-run seconds of `runs` (None without a timed run); `setup_s`: the
    seconds each swap setup took before its first run."""
    timed = [r for r in runs if r.wall_s is not None]
    if not timed:
        return None
    phases = {}
    for kind in dict.fromkeys(r.arm for r in timed):
        mine = [r for r in timed if r.arm == kind]
        phases[kind] = {
            p: statistics.median([r.phases.get(p, 0.0) for r in mine])
            for p in PHASES
            if any(p in r.phases for r in mine)
        }
    solo = [r.wall_s for r in timed if r.arm == "solo" and r.wall_s is not None]
    arms = [r.wall_s for r in timed if r.arm != "solo" and r.wall_s is not None]
    return Cost(
        phases=phases,
        solo_s=statistics.median(solo) if solo else 0.0,
        arm_s=statistics.median(arms) if arms else 0.0,
        setup_s=statistics.median(setup_s) if setup_s else 0.0,
    )


def projected_s(c: Cost, swaps: int, arms: int, rounds: int, boot_s: float = 0.0) -> float:
    """Seconds of a `swaps` x `arms` x `rounds` matrix at these costs, in one boot: per swap
    setup its setup, `rounds` + 1 solo runs (one a round and the closing one) and `rounds` x
    `arms` arm runs."""
    per_swap = c.setup_s + (rounds + 1) * c.solo_s + rounds * arms * c.arm_s
    return boot_s + swaps * per_swap


def cost_lines(c: Cost, full: tuple[int, int, int]) -> str:
    """Markdown: the median phase seconds per kind of run, then a run's cost and the projected
    full matrix (`full`: swap setups, arms, rounds)."""
    lines = ["| run | " + " | ".join(f"{p} (s)" for p in PHASES) + " |",
             "|---|" + "---|" * len(PHASES)]  # fmt: skip
    for kind, ph in c.phases.items():
        lines.append(f"| {kind} | " + " | ".join(fmt(ph.get(p), 1) for p in PHASES) + " |")
    swaps, arms, rounds = full
    lines += [
        "",
        f"a solo run {c.solo_s:.0f} s, an arm run {c.arm_s:.0f} s, a swap setup {c.setup_s:.0f}"
        f" s; {swaps} swap setups x {arms} arms x {rounds} rounds: "
        f"{projected_s(c, swaps, arms, rounds) / 3600:.2f} h (one boot, without it)",
    ]
    return "\n".join(lines)


def fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def table(rows: Sequence[Row]) -> str:
    """Markdown, one line a swap setup x arm: what docs/benchmarks.md and the closing note show."""
    lines = [
        "| swap | arm | rounds | tok/s vs solo: median | worst | TTFT p50 (s) | TTFT p95 (s) "
        "| OOM kills | job done (exit of the others) | job time (s) | weights re-read (pages) "
        "| fewest turns |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        done = f"{r.job_done}/{r.rounds}" + (f" ({r.job_exits})" if r.job_exits else "")
        done = "-" if r.arm == "solo" else done  # the chat alone: no job
        lines.append(
            f"| {r.swap} | {r.arm} | {r.rounds} | {fmt(r.ratio_median)} | "
            f"{fmt(r.ratio_worst)} | {fmt(r.ttft_p50)} | {fmt(r.ttft_p95)} | "
            f"{r.oom_kills}{f' ({r.kills})' if r.kills else ''} | {done} | "
            f"{fmt(r.job_s_median, 1)} | {fmt(r.refault_median, 0)} | {r.turns_fewest} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ writers

CSV_FIELDS = (
    "swap", "arm", "round", "seq", "tps", "ratio", "turns", "ttft_p50", "ttft_p95",
    "chat_rc", "job_rc", "job_s", "hog_rc", "refault_file", "full_s", "oom_kills", "kills",
    "actions", "error", "wall_s", *(f"{p}_s" for p in PHASES),
    *(f"cpu_{u}_s" for u in CPU_USERS),
)  # fmt: skip


def csv_row(r: RealRun) -> dict[str, Any]:
    d = asdict(r)
    d["ttft_p50"], d["ttft_p95"] = percentile(r.ttfts, 50), percentile(r.ttfts, 95)
    d["oom_kills"] = r.oom_kills
    d["kills"], d["actions"] = "; ".join(r.kills), "; ".join(r.actions)
    d.update({f"{p}_s": r.phases.get(p) for p in PHASES})
    d.update({f"cpu_{u}_s": r.cpu_s.get(u) for u in CPU_USERS})
    return {k: "" if d[k] is None else d[k] for k in CSV_FIELDS}


def write_csv(runs: Sequence[RealRun], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in runs:
            w.writerow(csv_row(r))


def write_json(runs: Sequence[RealRun], meta: dict[str, Any], path: Path) -> None:
    """{"meta": what ran (command, commit, date, kernel, policies), "runs": [...], "summary":
    [...]} (the runs as RealRun's fields, the summary as Row's)."""
    body = {
        "meta": meta,
        "runs": [asdict(r) for r in runs],
        "summary": [asdict(row) for row in summarise(runs)],
    }
    path.write_text(json.dumps(body, indent=1) + "\n")


def runs_from_json(items: Sequence[dict[str, Any]]) -> list[RealRun]:
    """RealRun records back from their JSON (unknown keys ignored: an older file still reads)."""
    names = {f.name for f in fields(RealRun)}
    return [RealRun(**{k: v for k, v in it.items() if k in names}) for it in items]


def pyplot() -> Any:
    """matplotlib.pyplot with the file-only Agg backend (the `plot` extra; scripts/setup --tests
    installs it)."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError as err:
        raise SystemExit(
            "bench: the plots need matplotlib: scripts/setup --tests (the `plot` extra)"
        ) from err
    return plt


def plot(rows: Sequence[Row], out: Path) -> list[Path]:
    """Two PNGs in `out`: qos-ratio.png (tokens/s vs solo per swap setup and arm: the median
    as a bar, the worst round as a dot, the 0.95x line) and qos-ttft.png (TTFT p50 bars, p95
    dots). The paths written."""
    plt = pyplot()
    arms = [a for a in ARMS if any(r.arm == a for r in rows)]
    swaps = [s for s in SWAPS if any(r.swap == s for r in rows)]
    width = 0.8 / max(1, len(arms))
    written = []
    for name, med, worst, ylabel in (
        ("qos-ratio.png", "ratio_median", "ratio_worst", "chat decode tokens/s vs solo"),
        ("qos-ttft.png", "ttft_p50", "ttft_p95", "time to first token (s): p50 bar, p95 dot"),
    ):
        fig, ax = plt.subplots(figsize=(7, 3.9))
        for i, arm in enumerate(arms):
            xs, ys, ws = [], [], []
            for j, swap in enumerate(swaps):
                got = [r for r in rows if r.arm == arm and r.swap == swap]
                if got:
                    xs.append(j + (i - (len(arms) - 1) / 2) * width)
                    ys.append(getattr(got[0], med) or 0.0)
                    ws.append(getattr(got[0], worst))
            ax.bar(xs, ys, width * 0.9, label=arm)
            pts = [(x, w) for x, w in zip(xs, ws, strict=True) if w is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", color="black", ms=4)
        if name == "qos-ratio.png":
            ax.axhline(LOW_RATIO, color="grey", ls="--", lw=0.8)
            ax.set_title("median (bar) and worst round (dot)", fontsize=9)
        ax.set_xticks(range(len(swaps)), [f"swap: {s}" for s in swaps])
        ax.set_ylabel(ylabel, fontsize=9)
        # below the axes: inside, it hid a worst-round or p95 dot
        ax.legend(fontsize=8, ncols=max(1, len(arms)), loc="upper center",
                  bbox_to_anchor=(0.5, -0.1), frameon=False)  # fmt: skip
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
