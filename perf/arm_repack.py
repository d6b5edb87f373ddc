#!/usr/bin/env python3
"""The estimate on ARM (issue 37): llama.cpp's own buffer sizes on three arm64 CPUs against
``governor --root <arm64 board tree> estimate`` for the same model and argv.

    .venv/bin/python -m perf.arm_repack [--model PATH] [--ctx 2048] [--cpu cortex-a76 ...]

Runs the arm64 llama.cpp of scripts/arm64-setup (runtime CPU dispatch: the ggml-cpu variant,
and with it what is repacked, follows the CPU) under qemu-aarch64 (qemu-user-static) as
``-cpu cortex-a53`` (armv8.0: no dotprod), ``cortex-a76`` (dotprod: RK3588's A55/A76, Pi 5) and
``max`` (i8mm, SVE), loading the model at ``-c CTX`` (one token generated). It reads
llama.cpp's ``CPU_REPACK model buffer``, ``CPU KV buffer`` and ``CPU compute buffer`` lines and
compares each with the estimate's repack, kv_cache and reserved compute buffer, computed with
the rk3588 fixture tree (tests/fixtures/hosts/rk3588) whose /proc/cpuinfo Features line is
replaced by the one that CPU has. Prints a table; exit 1 when a term is off by more than 10 %
(an estimate of 0 must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "hosts" / "rk3588"
ARM64 = Path(os.environ.get("GOVERNOR_ARM64_CACHE", "/var/lib/governor/engine-arm64"))
ENGINE = Path(os.environ.get("GOVERNOR_ENGINE_CACHE", "/var/lib/governor/engine"))
MIB = 1 << 20
TOLERANCE = 0.10

# /proc/cpuinfo "Features" of each CPU model as an arm64 kernel prints them (hwcaps):
# cortex-a53 is armv8.0 (crc32 but no atomics, no asimddp); cortex-a76 is RK3588's line
# (tests/fixtures/hosts/rk3588/proc/cpuinfo); qemu's max adds, among others, i8mm and sve.
FEATURES: dict[str, str] = {
    "cortex-a53": "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid",
    "cortex-a76": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
    "asimdrdm lrcpc dcpop asimddp",
    "max": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
    "jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm "
    "ssbs sb paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint "
    "svei8mm svebf16 i8mm bf16 dgh rng bti",
}
# what ggml-cpu printed for the variant it chose (system_info), per CPU: the cross-check that
# the Features line and the emulated CPU agree on dotprod / i8mm
VARIANT_FLAGS: dict[str, tuple[str, ...]] = {
    "cortex-a53": (),
    "cortex-a76": ("DOTPROD = 1",),
    "max": ("DOTPROD = 1", "MATMUL_INT8 = 1"),
}
LINES = {
    "repack": re.compile(r"CPU_REPACK model buffer size =\s*([\d.]+) MiB"),
    "kv_cache": re.compile(r"CPU KV buffer size =\s*([\d.]+) MiB"),
    "compute": re.compile(r"CPU compute buffer size =\s*([\d.]+) MiB"),
}


@dataclass
class Row:
    cpu: str
    family: str
    variant: str
    llama: dict[str, float]  # MiB, as printed
    estimate: dict[str, float]  # MiB
    seconds: float

    def ratio(self, term: str) -> float | None:
        got, want = self.estimate[term], self.llama[term]
        if want == 0:
            return None if got == 0 else float("inf")
        return got / want


def run_llama(cpu: str, model: Path, ctx: int) -> tuple[dict[str, float], str, float]:
    """llama-completion under qemu-aarch64 -cpu CPU: its buffer lines (MiB; 0 when a buffer is
    not printed, as CPU_REPACK is not when nothing is repacked) and its CPU line."""
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        sys.exit("qemu-aarch64 not found (apt-get install qemu-user-static)")
    binary = ARM64 / "bin" / "llama-completion"
    if not binary.exists():
        sys.exit(f"{binary} missing (scripts/arm64-setup engine)")
    argv = [
        qemu, "-cpu", cpu, "-L", "/usr/aarch64-linux-gnu", str(binary), "-m", str(model),
        "-c", str(ctx), "-n", "1", "-t", "2", "-p", "hello", "-no-cnv", "--no-warmup", "-lv", "4",
    ]  # fmt: skip
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=3600)
    wall = time.monotonic() - t0
    log = res.stdout + res.stderr
    if res.returncode != 0:
        sys.exit(f"llama-completion -cpu {cpu} exit {res.returncode}:\n{log[-3000:]}")
    out = {}
    for term, rx in LINES.items():
        m = rx.search(log)
        out[term] = float(m.group(1)) if m else 0.0
    cpu_line = next((ln for ln in log.splitlines() if "CPU :" in ln), "")
    return out, cpu_line, wall


def run_estimate(cpu: str, model: Path, ctx: int, tmp: Path) -> tuple[dict[str, float], str]:
    """`governor --root <rk3588 tree with CPU's Features> estimate --json`: repack, kv_cache
    and the reserved compute buffer in MiB, and the repack family it chose."""
    root = tmp / cpu
    shutil.copytree(FIXTURE, root, symlinks=True)
    info = (root / "proc" / "cpuinfo").read_text()
    info = re.sub(r"(?m)^Features\t: .*$", f"Features\t: {FEATURES[cpu]}", info)
    (root / "proc" / "cpuinfo").write_text(info)
    argv = [sys.executable, "-m", "governor", "--root", str(root), "estimate", str(model),
            "-c", str(ctx), "--json"]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    if res.returncode not in (0, 1):
        sys.exit(f"governor estimate exit {res.returncode}: {res.stderr}")
    doc = json.loads(res.stdout)
    terms = doc["terms"]
    from governor.engines.budget import host_family

    return {
        "repack": terms.get("repack", 0) / MIB,
        "kv_cache": terms["kv_cache"] / MIB,
        "compute": doc["compute_reserved"] / MIB,
    }, host_family(root)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=ENGINE / "models" / "qwen18b.gguf")
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--cpu", action="append", choices=sorted(FEATURES), default=[])
    args = p.parse_args(argv)
    cpus = args.cpu or ["cortex-a53", "cortex-a76", "max"]
    model = args.model.resolve()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="arm-repack.") as t:
        for cpu in cpus:
            llama, variant, wall = run_llama(cpu, model, args.ctx)
            missing = [f for f in VARIANT_FLAGS[cpu] if f not in variant]
            if missing:
                sys.exit(f"-cpu {cpu}: ggml chose a variant without {missing}: {variant}")
            est, family = run_estimate(cpu, model, args.ctx, Path(t))
            rows.append(Row(cpu, family, variant, llama, est, wall))
    print(f"model {model.name}, -c {args.ctx}; MiB, llama.cpp / estimate (ratio)")
    print(f"{'cpu':<11} {'family':<12} {'CPU_REPACK':>26} {'KV':>24} {'compute':>24}  wall")
    bad = False
    for r in rows:
        cells = []
        for term in ("repack", "kv_cache", "compute"):
            ratio = r.ratio(term)
            ok = ratio is None or abs(ratio - 1) <= TOLERANCE
            bad |= not ok
            rs = "=" if ratio is None else f"{ratio:.3f}"
            cells.append(
                f"{r.llama[term]:8.2f} / {r.estimate[term]:8.2f} ({rs}){'' if ok else '!'}"
            )
        print(f"{r.cpu:<11} {r.family:<12} {cells[0]:>26} {cells[1]:>24} {cells[2]:>24}"
              f"  {r.seconds:.0f}s")  # fmt: skip
    for r in rows:
        print(f"  {r.cpu}: {r.variant.strip()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
