"""llama-server's prompt cache by build (issue 45 item 4): from which build ``--cache-ram`` is a
hard cap, the engine's build number read from ``--version``, and the size of one saved state.

Before llama.cpp PR #25070 ("server: enforce prompt cache RAM limit", release tag b9908 on
ggml-org/llama.cpp: its release notes carry the PR's title and number) the cache always kept one
entry whatever its size and evicted old entries only after saving a new one, so it grew past
``--cache-ram``; forks (ik_llama.cpp issue 2320) still do. Since b9908 a state larger than the
cap is not saved and old entries are evicted before a new one is: the cap holds, and the
estimate's prompt_cache term (--cache-ram MiB) is a bound only there.

A saved state is a slot's KV (its prompt's cells): at most a full slot's, ``slot_cells`` x the
KV bytes of a token. A ``--cache-ram`` below one full slot's state keeps nothing a full
conversation needs (a state above the cap is skipped): the cache is off in effect.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

from governor.engines.estimate import MIB, Estimate

# the first llama.cpp release whose --cache-ram is a hard cap: PR #25070, released as b9908
CACHE_RAM_HARD_CAP_BUILD = 9908
VERSION_TIMEOUT_S = 10.0  # `llama-server --version` loads no model: well under a second
VERSION_CAP = 1 << 16  # what of its output is read

# `version: 0.5.0-dev (build 11312, commit 0c1e57098)` (a build with its number baked in, as
# scripts/engine-setup does) or upstream's `version: 11312 (0c1e57098)`
_BUILD_RE = re.compile(r"^version:\s*(?:.*\(build (?P<n>\d+)[,)]|(?P<u>\d+)\s*\()", re.MULTILINE)


def parse_build(text: str) -> int | None:
    """The build number in ``--version``'s output (None: none, or 0: a build without one)."""
    m = _BUILD_RE.search(text)
    if m is None:
        return None
    n = int(m["n"] or m["u"])
    return n or None


def engine_build(
    executable: str, run: Callable[..., subprocess.CompletedProcess[bytes]] = subprocess.run
) -> int | None:
    """``executable --version``'s build number; None when it does not run or says none."""
    try:
        done = run(
            [executable, "--version"],
            capture_output=True,
            timeout=VERSION_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = (done.stdout or b"")[:VERSION_CAP] + b"\n" + (done.stderr or b"")[:VERSION_CAP]
    return parse_build(out.decode("utf-8", "replace"))


def slot_state_bytes(est: Estimate) -> int:
    """One full slot's saved state: the KV of ``slot_cells`` tokens."""
    s = est.settings
    return est.term("kv_cache") // max(1, s.kv_cells // s.slot_cells)


def below_one_state(est: Estimate) -> str | None:
    """The warning for a ``--cache-ram`` below one full slot state (None: 0, -1 or enough)."""
    s = est.settings
    if not s.server or s.cache_ram_mib <= 0:
        return None
    state = slot_state_bytes(est)
    if s.cache_ram_mib * MIB >= state:
        return None
    return (
        f"--cache-ram {s.cache_ram_mib} MiB is below one full slot state"
        f" ({state / MIB:.1f} MiB at {s.slot_cells} tokens a slot): a state above the cap is"
        f" not saved, so the prompt cache is off in effect; pass --cache-ram"
        f" {-(-state // MIB)} or more, or 0"
    )


def not_a_cap(est: Estimate, build: int | None) -> str | None:
    """The warning for an engine whose ``--cache-ram`` is no hard cap (None: it is, or no cache)."""
    s = est.settings
    if not s.server or s.cache_ram_mib <= 0:
        return None
    if build is not None and build >= CACHE_RAM_HARD_CAP_BUILD:
        return None
    which = "its build is unknown" if build is None else f"it is build {build}"
    return (
        f"--cache-ram {s.cache_ram_mib} MiB is a hard cap only from llama.cpp b"
        f"{CACHE_RAM_HARD_CAP_BUILD} (PR #25070) and {which} (--version): an older build or a"
        " fork keeps one state of any size and saves before it evicts, so the prompt cache"
        " can grow past it"
    )


def cache_warnings(est: Estimate, build: int | None) -> list[str]:
    """`check`'s warnings about the prompt cache of this engine build."""
    return [w for w in (not_a_cap(est, build), below_one_state(est)) if w is not None]
