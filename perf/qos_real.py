"""perf/qos with the real engines (issue 48), the command line: `python -m perf.qos --engine real`.

    flock /tmp/governor-guest.lock .venv/bin/python -m perf.qos --guest --engine real \\
        --swap none,zram,zswap --arms bare,earlyoom,oomd,governor --rounds 3

In the 2 GiB systemd guest (TCG), per swap setup (none; zram; a swap area with zswap), set up
and torn down in turn: `governor init` writes the two engines' policies on that board, then
--rounds rounds of a solo run (the chat alone) and every arm, and a closing solo run:

  chat   llama-server (--chat-model, default the engine cache's kvguest.gguf, --cache-ram
         MiB: the prompt cache each new conversation grows, -t 1, a plain template: the
         messages' words) driven by the openai client: multi-turn conversations (--words new
         user words a turn, --answer tokens streamed back and as many words kept as the
         answer, a new conversation every --turns turns), measured for --chat-s seconds after
         a warm-up turn: time to first token a turn, decode tokens/s
  job    llama-completion (--job-model, default small.gguf: other weights competing for the
         page cache; -t 1) generating --job-tokens tokens at -c --job-ctx, and
         tests/helpers/hog.py touching --hog-mib MiB (0: MemAvailable at the start - 300 MiB),
         both started after the warm-up turn; the job's completion time recorded (a job still
         running --job-wait s after the window did not finish)
  arms   bare: systemd scopes without limits; earlyoom / oomd: scopes with the [memory] limits
         init wrote (MemoryMin/High/Max/SwapMax), earlyoom --prefer the job and the hog, or the
         background slice under ManagedOOMMemoryPressure=kill (--limit, --duration); governor:
         both engines under `governor launch` with init's policies. The hog is nobody's engine:
         an unmanaged scope in every arm; in the governor arm the board file lists its slice
         as background work (throttle, freeze), as an operator lists the board's other work;
         cpu-only (not in the default matrix): the job in a bare scope and no hog, the floor
         (what sharing the 2 vCPUs with the batch engine costs the chat; memory is no question)
  cost   per run the seconds of each phase (up, warm, window, job_wait, teardown), per swap
         setup its setup's; the table is followed by the median of each and the full matrix's
         projected time

Written to --out (default out/qos-real): runs.csv (a run a row), qos.json (meta: command,
commit, date, kernel, init's lines and policies; runs; summary), qos-ratio.png and
qos-ttft.png; the table is printed. With --guest the guest prints each run as a `qos-real-run`
line and the host writes the files (matplotlib needs only the host's venv).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from perf._helpers.engine_paths import BIN, CACHE
from perf._helpers.guest import began, stream
from perf.qos_common import REPO
from perf.qos_report import (
    ARMS,
    REAL_ARMS,
    SWAPS,
    RealRun,
    assign_ratios,
    cost,
    cost_lines,
    plot,
    runs_from_json,
    summarise,
    table,
    write_csv,
    write_json,
)

RUN_TAG, META_TAG = "qos-real-run ", "qos-real-meta "
RAW_NAME = "guest-records.txt"  # --guest: the guest's tagged lines, as printed
AUTO_HOG_SPARE_MIB = 300  # --hog-mib 0: the hog takes MemAvailable but this much
FULL_ROUNDS = 3  # the rounds: the matrix the cost lines project


def _csv(choices: Sequence[str], what: str) -> Any:
    def parse(text: str) -> list[str]:
        got = [x for x in text.split(",") if x]
        bad = [x for x in got if x not in choices]
        if bad or not got:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {','.join(bad) or '(none)'} (choose from {','.join(choices)})"
            )
        return got

    return parse


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not >= 1")
    return n


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="perf.qos --engine real", description=(__doc__ or "").splitlines()[0]
    )
    ap.add_argument("--swap", type=_csv(SWAPS, "swap setup"), default=list(SWAPS))
    ap.add_argument("--arms", type=_csv(ARMS, "arm"), default=list(REAL_ARMS))
    ap.add_argument(
        "--rounds", type=_positive, default=FULL_ROUNDS, help="rounds (solo + every arm)"
    )
    ap.add_argument("--chat-model", type=Path, default=CACHE / "models" / "kvguest.gguf")
    ap.add_argument("--job-model", type=Path, default=CACHE / "models" / "small.gguf")
    ap.add_argument("--cache-ram", type=_positive, default=384, help="llama-server --cache-ram")
    # a turn under TCG (one thread, 2 vCPUs) is ~10 s alone: 8 words and 6 tokens at ~4 prompt
    # and ~1 decode tokens/s; 60 s hold >= 5 turns. 4 turns a conversation keep its history (and
    # the attention's cost, which grows with it) short, and make a new prompt-cache entry often
    ap.add_argument("--chat-s", type=float, default=60.0, help="measured seconds of turns")
    ap.add_argument("--words", type=_positive, default=8, help="new user words a turn")
    ap.add_argument("--answer", type=_positive, default=6, help="tokens an answer")
    ap.add_argument("--turns", type=_positive, default=4, help="turns a conversation")
    ap.add_argument("--job-ctx", type=_positive, default=512, help="the job's -c")
    # ~10 s a token under TCG after ~10 s of load and ~13 prompt tokens: done inside the window
    ap.add_argument("--job-tokens", type=_positive, default=4, help="the job's -n")
    ap.add_argument(
        "--job-wait",
        type=float,
        default=30.0,
        help="seconds the job may run past the window before it did not finish",
    )
    ap.add_argument("--hog-mib", type=int, default=0, help="0: MemAvailable - 300 MiB")
    ap.add_argument("--swap-mib", type=_positive, default=1024, help="zram / zswap area size")
    ap.add_argument("--limit", default="15%", help="oomd ManagedOOMMemoryPressureLimit=")
    ap.add_argument("--duration", default="1s", help="oomd DefaultMemoryPressureDurationSec=")
    ap.add_argument("--out", type=Path, default=REPO / "out" / "qos-real")
    ap.add_argument("--no-plot", action="store_true", help="CSV and JSON only")
    ap.add_argument("--guest", action="store_true", help="run in the systemd test guest")
    ap.add_argument("--guest-timeout", type=float, default=6 * 3600.0)
    ap.add_argument("--guest-cpus", type=int, default=2, help="the guest's vCPUs (--guest)")
    return ap


def parse(argv: Sequence[str]) -> argparse.Namespace:
    return parser().parse_args(list(argv))


def collect(lines: Sequence[str]) -> tuple[list[RealRun], dict[str, Any]]:
    """The runs and the meta the guest printed (`qos-real-run JSON`, `qos-real-meta JSON`)."""
    runs: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    for line in lines:
        with contextlib.suppress(ValueError):  # a line the guest's end cut short
            if line.startswith(RUN_TAG):
                runs.append(json.loads(line[len(RUN_TAG) :]))
            elif line.startswith(META_TAG):
                meta.update(json.loads(line[len(META_TAG) :]))
    return runs_from_json(runs), meta


def finish(runs: list[RealRun], meta: dict[str, Any], out: Path, with_plot: bool) -> str:
    """Ratios, then runs.csv, qos.json and (with_plot) the PNGs in `out`; the table."""
    assign_ratios(runs)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(runs, out / "runs.csv")
    write_json(runs, meta, out / "qos.json")
    rows = summarise(runs)
    if with_plot and rows:
        for p in plot(rows, out):
            print(f"bench: wrote {p}", flush=True)
    c = cost(runs, list(meta.get("setup_s", {}).values()))
    full = (len(SWAPS), len(REAL_ARMS), FULL_ROUNDS)
    return table(rows) + ("" if c is None else "\n\n" + cost_lines(c, full))


def host_meta(argv: Sequence[str]) -> dict[str, Any]:
    """The command, and the commit and date it begins at."""
    return {"command": "python -m perf.qos --engine real " + " ".join(argv), **began()}


def in_guest(argv: list[str], a: argparse.Namespace) -> int:
    """Run the bench in the systemd guest, its output streamed here; the files written here."""
    inner = [x for x in argv if x not in ("--guest", "--no-plot")]
    # the host writes the files and the plots: the guest only prints its runs
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "perf.qos", "--engine", "real", *inner,
           "--no-plot"]  # fmt: skip
    started = host_meta(inner)
    a.out.mkdir(parents=True, exist_ok=True)
    lines, code = stream("systemd", cmd, timeout=a.guest_timeout, cpus=a.guest_cpus,
                         hide=(RUN_TAG, META_TAG), keep=a.out / RAW_NAME)  # fmt: skip
    runs, meta = collect(lines)
    if not runs:
        print("bench: the guest reported no run", flush=True)
        return code or 1
    print("\n" + finish(runs, {**started, **meta}, a.out, not a.no_plot), flush=True)
    return code


def mem_available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise SystemExit("bench: no MemAvailable in /proc/meminfo")


def in_this_machine(argv: list[str], a: argparse.Namespace) -> int:
    from perf._helpers.disk import loop_mount
    from perf.qos_guest import log, sh
    from perf.qos_real_guest import Setup, policies, rounds, stage_models, swap_setup

    for m in (a.chat_model, a.job_model):
        if not m.exists():
            raise SystemExit(f"bench: {m} missing (scripts/engine-setup)")
    log(f"kernel {os.uname().release}, {os.cpu_count()} cpus, free -m: "
        f"{sh('free', '-m').splitlines()[1]}")  # fmt: skip
    hog = a.hog_mib or mem_available_mib() - AUTO_HOG_SPARE_MIB
    size = sum(m.stat().st_size for m in (a.chat_model, a.job_model)) // (1 << 20) + 96
    meta: dict[str, Any] = {"kernel": os.uname().release, "hog_mib": hog, "swaps": {}, "init": {},
                            "setup_s": {}}  # fmt: skip
    runs: list[RealRun] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as mnt, loop_mount(Path(mnt), size) as disk:
        chat_model, job_model = stage_models(disk, (a.chat_model, a.job_model))
        meta["staging_s"] = round(time.monotonic() - t0, 1)
        for swap in a.swap:
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory() as tmpd, swap_setup(swap, a.swap_mib) as what:
                log(f"swap setup {swap}: {what}")
                st = Setup(
                    tmp=Path(tmpd), chat_model=chat_model, job_model=job_model,
                    server=BIN / "llama-server", completion=BIN / "llama-completion",
                    cache_ram=a.cache_ram, job_ctx=a.job_ctx, job_tokens=a.job_tokens,
                    hog_mib=hog, chat_s=a.chat_s, words=a.words, answer=a.answer,
                    turns=a.turns, oomd_limit=a.limit, oomd_duration=a.duration,
                    job_wait_s=a.job_wait,
                )  # fmt: skip
                policies(st)
                meta["setup_s"][swap] = round(time.monotonic() - t0, 1)
                assert st.chat_policy is not None and st.job_policy is not None
                meta["swaps"][swap] = what
                meta["init"][swap] = {"said": st.said, "chat": st.chat_policy.read_text(),
                                      "job": st.job_policy.read_text()}  # fmt: skip
                print(META_TAG + json.dumps(meta), flush=True)
                for run in rounds(st, swap, a.arms, a.rounds):
                    runs.append(run)
                    print(RUN_TAG + json.dumps(asdict(run)), flush=True)
    print("\n" + finish(runs, {**host_meta(argv), **meta}, a.out, not a.no_plot), flush=True)
    return 0


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    a = parse(args)
    if a.guest:
        return in_guest(args, a)
    if os.geteuid() != 0 or Path("/proc/1/comm").read_text().strip() != "systemd":
        raise SystemExit("bench: needs root and systemd as PID 1 (use --guest)")
    return in_this_machine(args, a)
