"""perf/router's rounds and files (issue 48: the router benchmark gets the QoS benchmark's
treatment): every arm run --rounds times, per arm the median round beside its WORST one
(latency, weights re-read, peak, failures, OOM kills), and the writers: CSV (one row an arm's
round), JSON (what ran, every round, the summary) and PNG plots (matplotlib, the `plot` extra).
The guest prints each round as a `router-run JSON` line; the host collects them and writes the
files (matplotlib needs only the host's venv). Also the command line and the host's side of
--guest; perf/router.py runs the arms (as root on a cgroup v2 kernel)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from perf._helpers.guest import began, stream
from perf.qos_report import fmt, pyplot
from perf.router_common import ARMS, MIB, VARIANTS, Result, parse_arms, value_table

REPO = Path(__file__).resolve().parents[1]

RUN_TAG, META_TAG = "router-run ", "router-meta "
RAW_NAME = "guest-records.txt"  # --guest: the guest's tagged lines, as printed


def to_json(r: Result) -> dict[str, Any]:
    """A round's result as JSON (the arm by its name, e.g. "3a")."""
    return {**asdict(r), "arm": r.arm.name}


def from_json(item: dict[str, Any]) -> Result:
    """A round's result back (unknown keys ignored: an older file still reads)."""
    names = {f.name for f in fields(Result)}
    kw = {k: v for k, v in item.items() if k in names}
    kw["arm"] = parse_arms(str(item["arm"]))[0]
    kw["loads"] = [tuple(x) for x in kw.get("loads", [])]
    kw["reloaded_turns"] = [tuple(x) for x in kw.get("reloaded_turns", [])]
    return Result(**kw)


def collect(lines: Sequence[str]) -> tuple[list[Result], dict[str, Any]]:
    """The rounds and the meta the guest printed among its log lines."""
    runs: list[Result] = []
    meta: dict[str, Any] = {}
    for line in lines:
        # a line the guest's end cut short, or a record of an arm this version does not know
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if line.startswith(RUN_TAG):
                runs.append(from_json(json.loads(line[len(RUN_TAG) :])))
            elif line.startswith(META_TAG):
                meta.update(json.loads(line[len(META_TAG) :]))
    return runs, meta


@dataclass
class Row:
    """One arm over its rounds: the median round and the worst (the highest latency, re-read,
    peak; the most failures and kills)."""

    arm: str
    describe: str
    rounds: int
    requests: int  # over all rounds
    failed: int  # over all rounds
    failed_worst: int  # in one round
    oom_kills: int  # memory.events oom_kill over all rounds
    oom_kills_worst: int
    peak_mib_median: float | None
    peak_mib_worst: float | None
    reread_mib_median: float
    reread_mib_worst: float
    latency_median_s: float | None  # the median of the rounds' median latencies
    latency_median_worst_s: float | None  # the worst round's median latency
    latency_max_s: float | None  # the median of the rounds' slowest request
    latency_max_worst_s: float | None  # the slowest request of all rounds
    unloads_median: float | None  # governed arms only


def _med(vals: Sequence[float | None]) -> float | None:
    got = [v for v in vals if v is not None]
    return statistics.median(got) if got else None


def _worst(vals: Sequence[float | None]) -> float | None:
    got = [v for v in vals if v is not None]
    return max(got) if got else None


def summarise(runs: Sequence[Result]) -> list[Row]:
    """A row per arm, in the order the arms first ran."""
    order = list(dict.fromkeys(r.arm for r in runs))
    rows = []
    for arm in order:
        rs = [r for r in runs if r.arm == arm]
        peaks = [None if r.peak is None else r.peak / MIB for r in rs]
        rereads = [r.reread_mib for r in rs]
        rows.append(
            Row(
                arm=arm.name, describe=arm.describe(), rounds=len(rs),
                requests=sum(r.failed + len(r.latencies) for r in rs),
                failed=sum(r.failed for r in rs), failed_worst=max(r.failed for r in rs),
                oom_kills=sum(r.oom_kills for r in rs),
                oom_kills_worst=max(r.oom_kills for r in rs),
                peak_mib_median=_med(peaks), peak_mib_worst=_worst(peaks),
                reread_mib_median=statistics.median(rereads), reread_mib_worst=max(rereads),
                latency_median_s=_med([r.median_s for r in rs]),
                latency_median_worst_s=_worst([r.median_s for r in rs]),
                latency_max_s=_med([r.max_s for r in rs]),
                latency_max_worst_s=_worst([r.max_s for r in rs]),
                unloads_median=statistics.median(r.unloads for r in rs) if arm.governed else None,
            )
        )  # fmt: skip
    return rows


def table(rows: Sequence[Row]) -> str:
    """Markdown, one line an arm: its median round and (after the slash) its worst."""
    lines = [
        "| arm | rounds | requests failed (worst round) | OOM kills (worst round) | peak MiB:"
        " median / worst | weights re-read MiB: median / worst | latency median s: median /"
        " worst | latency max s: median / worst | governor unloads (median) |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        cells = (
            f"{r.arm}: {r.describe}", str(r.rounds),
            f"{r.failed} of {r.requests} ({r.failed_worst})",
            f"{r.oom_kills} ({r.oom_kills_worst})",
            f"{fmt(r.peak_mib_median, 0)} / {fmt(r.peak_mib_worst, 0)}",
            f"{r.reread_mib_median:.0f} / {r.reread_mib_worst:.0f}",
            f"{fmt(r.latency_median_s, 1)} / {fmt(r.latency_median_worst_s, 1)}",
            f"{fmt(r.latency_max_s, 1)} / {fmt(r.latency_max_worst_s, 1)}",
            fmt(r.unloads_median, 0),
        )  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ writers

CSV_FIELDS = (
    "arm", "variant", "round", "requests", "failed", "oom_kills", "kernel_kills", "peak_mib",
    "peak_source", "reread_mib", "latency_median_s", "latency_max_s", "unloads", "loads",
    "reload_s", "wall_s", "errors",
)  # fmt: skip


def csv_row(r: Result) -> dict[str, Any]:
    got: dict[str, Any] = {
        "arm": r.arm.name, "variant": r.arm.variant, "round": r.round,
        "requests": r.failed + len(r.latencies), "failed": r.failed, "oom_kills": r.oom_kills,
        "kernel_kills": r.kernel_kills,
        "peak_mib": None if r.peak is None else round(r.peak / MIB, 1),
        "peak_source": r.peak_source, "reread_mib": round(r.reread_mib, 1),
        "latency_median_s": r.median_s, "latency_max_s": r.max_s,
        "unloads": r.unloads if r.arm.governed else None, "loads": len(r.loads),
        "reload_s": round(sum(s for _m, s in r.loads), 2), "wall_s": round(r.wall_s, 1),
        "errors": "; ".join(r.errors),
    }  # fmt: skip
    return {k: "" if got[k] is None else got[k] for k in CSV_FIELDS}


def write_csv(runs: Sequence[Result], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in runs:
            w.writerow(csv_row(r))


def write_json(runs: Sequence[Result], meta: dict[str, Any], path: Path) -> None:
    """{"meta": what ran, "runs": [every round], "summary": [a Row an arm]}."""
    body = {
        "meta": meta,
        "runs": [to_json(r) for r in runs],
        "summary": [asdict(row) for row in summarise(runs)],
    }
    path.write_text(json.dumps(body, indent=1) + "\n")


def plot(rows: Sequence[Row], out: Path) -> list[Path]:
    """router-latency.png (each arm's median latency: the median round as a bar, the worst
    round as a dot, the slowest request as a cross) and router-reread.png (the weights
    re-read, MiB: median bar, worst dot). The paths written."""
    plt = pyplot()
    xs = list(range(len(rows)))
    colours = {"a": "tab:blue", "b": "tab:orange", "c": "tab:green"}
    written = []
    for name, med, worst, extra, ylabel in (
        ("router-latency.png", "latency_median_s", "latency_median_worst_s",
         "latency_max_worst_s", "median request latency (s)"),
        ("router-reread.png", "reread_mib_median", "reread_mib_worst", None,
         "weights re-read (MiB)"),
    ):  # fmt: skip
        fig, ax = plt.subplots(figsize=(7, 3.6))
        ys = [getattr(r, med) or 0.0 for r in rows]
        ax.bar(xs, ys, 0.7, color=[colours.get(r.arm[-1], "tab:grey") for r in rows])
        for x, r in zip(xs, rows, strict=True):
            if (w := getattr(r, worst)) is not None:
                ax.plot([x], [w], "o", color="black", ms=4)
            if extra is not None and (e := getattr(r, extra)) is not None:
                ax.plot([x], [e], "x", color="black", ms=5)
        ax.set_xticks(xs, [r.arm for r in rows])
        ax.set_xlabel("arm (1: alone, --models-max 2; 2: alone, 3; 3: governor; 4: LRU order)",
                      fontsize=8)  # fmt: skip
        ax.set_ylabel(ylabel, fontsize=9)
        marks = "median round (bar), worst round (dot)" + (", slowest request (x)" if extra else "")
        rounds = max((r.rounds for r in rows), default=0)
        ax.set_title(f"{marks}; {rounds} round(s) an arm", fontsize=9)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def finish(runs: list[Result], meta: dict[str, Any], out: Path, with_plot: bool) -> str:
    """runs.csv, router.json and (with_plot) the PNGs in `out`; the summary table (and variant
    c's table of its rounds, perf/router_common.value_table)."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(runs, out / "runs.csv")
    write_json(runs, meta, out / "router.json")
    rows = summarise(runs)
    if with_plot and rows:
        for p in plot(rows, out):
            print(f"perf/router: wrote {p}", flush=True)
    text = table(rows)
    if by_value := [r for r in runs if VARIANTS[r.arm.variant].mixed]:
        text += "\n\n" + value_table(by_value)
    return text


# ------------------------------------------------------------------------------ command line


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="perf.router",
        description="llama-server's router alone vs under the governor (evict = memory)",
    )
    ap.add_argument("--arms", default=",".join(a.name for a in ARMS))
    ap.add_argument("--requests", type=int, default=9, help="requests per arm")
    ap.add_argument("--tokens", type=int, default=2, help="tokens per answer")
    ap.add_argument("--rounds", type=_positive, default=3, help="rounds of every arm")
    ap.add_argument(
        "--pattern",
        type=_pattern,
        default=None,
        help="variant c's request mix: the models asked, in order, repeated (default abc;"
        " e.g. aabcaabc: a hot, b and c cold)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "out" / "router")
    ap.add_argument("--no-plot", action="store_true", help="CSV and JSON only")
    ap.add_argument("--guest", action="store_true", help="run in the kernel test guest")
    ap.add_argument("--guest-timeout", type=float, default=None, help="default 2400 s a round")
    ap.add_argument("--guest-cpus", type=int, default=2, help="the guest's vCPUs (--guest)")
    return ap


def _pattern(text: str) -> str:
    if not text or set(text) - set("abc"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a sequence of the models a, b and c")
    return text


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not >= 1")
    return n


def in_guest(argv: list[str], a: argparse.Namespace) -> int:
    """Run this module in the kernel guest through the project's harness (tests/vm/run.py),
    its output streamed here; the rounds it printed written to a.out here."""
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "perf.router", *argv, "--no-plot"]
    start = began()
    a.out.mkdir(parents=True, exist_ok=True)
    raw = a.out / RAW_NAME  # the guest's records as they come, before anything reads them
    lines, code = stream("kernel", cmd, timeout=a.guest_timeout, cpus=a.guest_cpus,
                         hide=(RUN_TAG, META_TAG), keep=raw)  # fmt: skip
    runs, meta = collect(lines)
    if not runs:
        print("perf/router: the guest reported no round", flush=True)
        return code or 1
    meta = {**meta, "command": "python -m perf.router " + " ".join(argv), **start}
    try:
        print("\n" + finish(runs, meta, a.out, not a.no_plot), flush=True)
    except Exception as err:  # any failure of the report: the data is on disk already
        print(f"perf/router: the report failed ({type(err).__name__}: {err}); the guest's "
              f"records are in {raw}", flush=True)  # fmt: skip
        return code or 1
    return code
