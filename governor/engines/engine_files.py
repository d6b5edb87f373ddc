"""The engine's own files an estimate of memory.peak counts: its binary and the shared
libraries shipped beside it.

After a cold cache (a board's boot, a drop) the engine's exec reads its binary and its
libraries into the page cache, and those pages are charged to the engine's cgroup like the
model's (cgroup-v2.rst "Memory Ownership": the cgroup that first faults a page owns it). For
scripts/engine-setup's static build that is the whole binary: `fincore` shows all 11 MiB of
llama-completion resident after one run of the tiny model, evicted first (docs/calibration.md).
A release build ships libllama/libggml* as ``lib*.so*`` beside the binary: all of them are
counted (an upper bound: a ggml backend variant that is not loaded is counted too). System
libraries (libc, libstdc++) are left out: other processes keep them resident.

An argv whose program is not a path to a file (a bare name, a test's stand-in) gets
governor/engines/estimate.py's ENGINE_FILE_BYTES.
"""

from __future__ import annotations

import os
from pathlib import Path


def engine_file_paths(program: str, *, root: Path, cwd: Path | None = None) -> list[Path] | None:
    """``program`` (a path, absolute under ``root`` or relative to ``cwd``) resolved, then the
    ``lib*.so*`` files in its directory, each file once; None when it is a bare name or not a
    regular file. The plan cache keys a launch on them too (governor/api/launch_compile.py): a
    new build at the same path moves the estimate."""
    found = _engine_files(program, root=root, cwd=cwd)
    return None if found is None else [p for p, _ in found]


def engine_file_bytes(program: str, *, root: Path, cwd: Path | None = None) -> int | None:
    """Bytes of :func:`engine_file_paths` (the binary and the libraries beside it)."""
    found = _engine_files(program, root=root, cwd=cwd)
    return None if found is None else sum(size for _, size in found)


def _engine_files(program: str, *, root: Path, cwd: Path | None) -> list[tuple[Path, int]] | None:
    """(path, size) of the binary and of each library beside it, each file once."""
    if "/" not in program:
        return None
    path = root / program.lstrip("/") if program.startswith("/") else (cwd or Path()) / program
    try:
        binary = path.resolve()
        st = binary.stat()
    except (OSError, RuntimeError):
        return None
    if not binary.is_file():
        return None
    seen = {(st.st_dev, st.st_ino)}
    out = [(binary, st.st_size)]
    try:
        beside = sorted(binary.parent.glob("lib*.so*"))
    except OSError:
        beside = []
    for lib in beside:
        try:
            lst = lib.stat()
        except OSError:
            continue
        if os.path.isfile(lib) and (lst.st_dev, lst.st_ino) not in seen:
            seen.add((lst.st_dev, lst.st_ino))
            out.append((lib, lst.st_size))
    return out
