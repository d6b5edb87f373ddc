"""What scripts/demo prints after a launch: the run's report (`governor launch --report`), the
engine's stderr (llama.cpp's timing lines) and the policy, summed up in a few plain lines.

    demo_report.py REPORT.json ENGINE.log POLICY.toml
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

from governor.bench.timings import parse_timings

MIB = 1 << 20


def _mib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / MIB:.0f} MiB"


def main(argv: list[str]) -> int:
    report = json.loads(Path(argv[0]).read_text())
    timings = parse_timings(Path(argv[1]).read_text(errors="replace"))
    policy = tomllib.loads(Path(argv[2]).read_text())
    mem = policy.get("memory", {})
    sampler = report.get("extra", {}).get("monitor", {}).get("sampler", {})
    est = report.get("extra", {}).get("estimate", {}).get("total")
    status = report["exit_code"] if report.get("signal") is None else report["signal_name"]
    print(f"   engine exit        {status}  ({report['wall_seconds']:.1f} s)")
    print(f"   cgroup             {report['cgroup']}")
    print(
        f"   policy memory      min {mem.get('min')}  high {mem.get('high')}  max {mem.get('max')}"
        f"  (estimate {_mib(est)})"
    )
    peak = report.get("memory_peak")
    print(f"   memory.peak        {_mib(peak)}" + ("" if peak else "  (memory controller missing)"))
    print(f"   anon / file        {_mib(sampler.get('anon'))} / {_mib(sampler.get('file'))}"
          "  (last sample)")  # fmt: skip
    high, max_, kills = (
        "unknown" if report.get(k) is None else report[k]
        for k in ("memory_events_high", "memory_events_max", "oom_kill")
    )
    print(f"   memory.events      high {high}  max {max_}  oom_kill {kills}")
    fired = sum(r["fired"] for r in report.get("extra", {}).get("monitor", {}).get("rules", []))
    print(f"   pressure rules     {fired} firing(s)")
    pre, dec = timings.prefill_tps, timings.decode_tps
    print(
        f"   tokens/s           prefill {pre or 0:.2f}  decode {dec or 0:.2f}"
        f"  ({timings.decode_tokens} tokens generated)"
    )
    degraded = report.get("degraded") or []
    for d in degraded:
        print(f"   NOT in force       {d}")
    if not degraded:
        print("   every limit of the policy was in force")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
