#!/usr/bin/env python3
"""QoS under contention (issue 23): an interactive engine beside a background job, six arms.

    flock /tmp/governor-guest.lock .venv/bin/python -m perf.qos --guest [--repeat 2]
    .venv/bin/python -m perf.qos [--repeat 2]   # as root where systemd is PID 1 (the guest)
    ... -m perf.qos --engine real [--guest] ...   # the real engines (issue 48): perf/qos_real.py

The workload (the issue's, in the 2 GiB systemd guest, no swap): tests/helpers/kvchat.py, the
interactive engine, reads a 400 MiB mmapped model (an ext4 loop file: real, evictable page
cache) every step while its KV cache (anonymous) grows 150 -> 550 MiB over 40 s, for 80 s
(--chat-s); from t = 20 s tests/helpers/hog.py, the background job, grows to 950 MiB (16 MiB
every 0.25 s at most: ~30 MiB/s under TCG, its page faults set the pace), holds it 5 s and
exits 0: its work is done. Arms:

  bare        both in systemd scopes (systemd-run --scope) without memory limits
  governor    both under `governor launch`, policies from policies/npu-chat.toml and
              npu-batch.toml (their [qos], oom_score_adj and memory [[pressure]] rules; memory
              scaled: chat min = its working set, the model + the KV cache at its end +
              16 MiB, high +150M, max +250M; batch as shipped),
              without the rules whose `do` has `shed`
  gov+shed    the same with npu-chat's `shed` rules (board PSI, MemAvailable floor)
  oomd        bare scopes, the job's in a slice with ManagedOOMMemoryPressure=kill
              (--limit 15 %, --duration 1 s: the quickest systemd-oomd can be set to act)
  earlyoom    bare scopes, earlyoom --prefer the job, --avoid the chat (its defaults: acts
              below 10 % MemAvailable, SIGTERM, then SIGKILL below 5 %)
  cpu-only    the floor: no memory contention, the job replaced by a busy loop on the
              "little" vCPU for the chat's measured window: what sharing the emulated board
              alone costs the chat

Every arm and the solo runs place the CPUs alike, so the arms differ in how memory is
handled only: the chat on the "big" vCPU(s), the job on the "little" one(s)
(perf.qos_common.guest_cpu: the upper and lower half of the guest's CPUs; the governor arms by
the policies' [cpu], the others by systemd's AllowedCPUs=). Unpinned, the solo chat ran ~1.2x slower than pinned beside a
busy loop (likely TCG's per-vCPU software TLB, refilled when a process moves).

Solo runs (the chat alone, bare) are interleaved with the arms in every round and a round ends
with one: TCG speed drifts within a boot, so each arm's speed is divided by the mean of the solo
runs around it. Measured per run: the chat's steps/s from t = 20 s to its end; stall seconds
(full: the chat cgroup's memory.pressure `full` total over that window; slow: the time in steps
slower than 4x the solo median step); kills (the kernel's OOM kills by process name from the
kernel log, memory.events oom_kill of each cgroup, the exit statuses, oomd's and earlyoom's
own kill lines); whether the job completed (exit 0 after its `done`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from perf.qos_common import ARMS, REPO, cpu_table, table


def in_guest(argv: list[str], timeout: float, cpus: int) -> int:
    """Run this module in the systemd guest through the project's harness (tests/vm/run.py)."""
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "perf.qos", *argv]
    harness = [sys.executable, "-m", "vm.run", "--guest", "systemd", f"--timeout={timeout}",
               f"--cpus={cpus}"]  # fmt: skip
    return subprocess.call([*harness, "--", *cmd], cwd=REPO / "tests")


def main() -> int:
    pre = argparse.ArgumentParser(add_help=False)
    # kvchat: tests/helpers/kvchat.py + hog.py, six arms (issue 23); real: llama-server +
    # llama-completion + hog.py on three swap setups (issue 48, perf/qos_real.py)
    pre.add_argument("--engine", choices=("kvchat", "real"), default="kvchat")
    known, rest = pre.parse_known_args()
    if known.engine == "real":
        from perf.qos_real import main as real

        return real(rest)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=2, help="rounds (each: solo + every arm)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"subset of {','.join(ARMS)}")
    ap.add_argument("--model-mib", type=int, default=400)
    ap.add_argument("--bg-mib", type=int, default=950)
    # 80 s, not the 50: under TCG page faults hold the job to ~30 MiB/s, so it reaches
    # its 950 MiB ~32 s after it starts (t = 52 s); the chat must still hold its KV cache then
    ap.add_argument("--chat-s", type=float, default=80.0, help="the chat's seconds of steps")
    ap.add_argument("--limit", default="15%", help="oomd ManagedOOMMemoryPressureLimit=")
    ap.add_argument("--duration", default="1s", help="oomd DefaultMemoryPressureDurationSec=")
    ap.add_argument("--json", type=Path, default=None, help="also write the runs here")
    ap.add_argument("--guest", action="store_true", help="run in the systemd test guest")
    ap.add_argument("--guest-timeout", type=float, default=3000.0)
    # 2, not the test tiers' 4: with more vCPUs than the host's 2 cores the host's scheduler,
    # not the guest's cpu.weight and cpusets, decides who runs (the issue measured 2 vCPUs)
    ap.add_argument("--guest-cpus", type=int, default=2, help="the guest's vCPUs (--guest)")
    ap.add_argument(
        "--engine",
        choices=("kvchat", "real"),
        default="kvchat",
        help="real: the real engines (perf/qos_real.py; --engine real --help)",
    )
    a = ap.parse_args()
    if a.guest:
        return in_guest([x for x in sys.argv[1:] if x != "--guest"], a.guest_timeout, a.guest_cpus)
    if os.geteuid() != 0 or Path("/proc/1/comm").read_text().strip() != "systemd":
        raise SystemExit("bench: needs root and systemd as PID 1 (use --guest)")
    arms = [x for x in a.arms.split(",") if x]
    if bad := [x for x in arms if x not in ARMS]:
        raise SystemExit(f"bench: unknown arm {bad} (--arms: {','.join(ARMS)})")
    from perf._helpers.disk import loop_mount, make_file
    from perf.qos_guest import Setup, bench, log, sh

    mem = sh("free", "-m").splitlines()[1]
    log(f"kernel {os.uname().release}, {os.cpu_count()} cpus, free -m: {mem}")

    with (
        tempfile.TemporaryDirectory() as tmpd,
        tempfile.TemporaryDirectory() as mnt,
        loop_mount(Path(mnt), a.model_mib + 64) as disk,
    ):
        model = make_file(disk / "model.bin", a.model_mib)
        st = Setup(model, Path(tmpd), a.chat_s, a.bg_mib, a.limit, a.duration)
        runs, solos = bench(st, a.repeat, arms)
    print("\n" + table(runs, solos) + "\n\n" + cpu_table(runs, solos), flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps([r.__dict__ for r in [*runs, *solos]], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
