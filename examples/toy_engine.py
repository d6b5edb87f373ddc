#!/usr/bin/env python3
"""A stand-in LLM engine for demos: it maps a "model" file and reads every page of it (like
llama.cpp's mmap load), then grows an anonymous "KV cache" token by token and prints timing
lines in llama.cpp's format. It has llama.cpp's flags for what the governor reads
(-m, -c, -t, -n), so policies with engine.kind = "llama.cpp" check it the same way.

    toy_engine.py -m MODEL -c CTX [-n TOKENS] [--kv-kib-per-token K] [--ms-per-token MS]

With -c 2048 and the default 192 KiB per token (a Qwen-1.8B-shaped model's f16 KV cache) the
KV cache reaches 384 MiB; in a slice whose memory.max is below model + KV it is OOM-killed.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time

PAGE = mmap.PAGESIZE


def main() -> int:
    p = argparse.ArgumentParser(description="stand-in LLM engine for governor demos")
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-c", "--ctx-size", type=int, default=512)
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("-n", "--n-predict", type=int, default=None, help="tokens (default: ctx)")
    p.add_argument("--kv-kib-per-token", type=int, default=192)
    p.add_argument("--ms-per-token", type=float, default=1.0)
    a = p.parse_args()

    t0 = time.monotonic()
    with open(a.model, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        weights = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) if size else None
    checksum = 0
    if weights is not None:
        for off in range(0, size, PAGE):  # fault every page in, as a mmap load does
            checksum ^= weights[off]
    load_ms = (time.monotonic() - t0) * 1000
    print(
        f"load_tensors: model size = {size / 2**20:.2f} MiB, loaded in {load_ms:.1f} ms",
        file=sys.stderr,
    )

    n = a.ctx_size if a.n_predict is None else min(a.n_predict, a.ctx_size)
    kv: list[bytearray] = []
    t1 = time.monotonic()
    for i in range(n):
        block = bytearray(a.kv_kib_per_token * 1024)
        block[::PAGE] = b"\x01" * len(block[::PAGE])  # touch every page of this token's KV
        kv.append(block)
        if a.ms_per_token:
            time.sleep(a.ms_per_token / 1000)
        if (i + 1) % 256 == 0:
            print(
                f"toy: {i + 1} tokens, kv {len(kv) * a.kv_kib_per_token / 1024:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )
    eval_ms = (time.monotonic() - t1) * 1000
    per = eval_ms / max(n, 1)
    print(
        f"llama_perf_context_print:        eval time = {eval_ms:10.2f} ms / {n:5d} runs"
        f"   ({per:8.2f} ms per token, {1000 / per if per else 0:8.2f} tokens per second)",
        file=sys.stderr,
    )
    print(f"toy: generated {n} tokens (checksum {checksum})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
