"""The files a prefetch reads (preflight step b, governor/engines/preflight.py): resolved from
the policy's ``prefetch.files`` ("auto": the llama.cpp model's split-GGUF parts; else paths and
globs relative to the current directory), each once and in order, then checked present (66),
readable (77) and a regular file (65) before anything is applied.
"""

from __future__ import annotations

import glob as glob_mod
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from governor.engines.llama import model_parts
from governor.errors import PermissionDenied, PolicyError, PolicyNotFound


def resolve_files(
    spec: Literal["auto"] | Sequence[str],
    *,
    model: str | None,
    engine_kind: str,
    cwd: Path,
    source: str | None = None,
) -> list[Path]:
    """The files to prefetch, in order and once each: the engine's model (all split-GGUF parts)
    for "auto", else each path or glob (relative to ``cwd``). Missing -> 66, unreadable -> 77,
    not a regular file -> 65."""
    if spec == "auto":
        if engine_kind != "llama.cpp":
            raise PolicyError(
                'prefetch.files = "auto" takes the model from a llama.cpp argv (-m)',
                file=source,
                field="prefetch.files",
                hint='list the files for a generic engine: files = ["/models/x.gguf"]',
            )
        if model is None:
            raise PolicyError(
                'prefetch.files = "auto" needs the engine\'s -m/--model',
                file=source,
                field="prefetch.files",
                hint="pass the model with -m, or list the files in prefetch.files",
            )
        found = [p if p.is_absolute() else cwd / p for p in model_parts(model)]
    else:
        found = []
        for entry in spec:
            pattern = entry if os.path.isabs(entry) else str(cwd / entry)
            if glob_mod.has_magic(entry):
                matches = sorted(glob_mod.glob(pattern))
                if not matches:
                    raise PolicyNotFound(
                        f"prefetch glob matches no file: {entry}",
                        file=source,
                        field="prefetch.files",
                        hint="check the pattern (relative paths start from the current directory)",
                    )
                found += [Path(m) for m in matches]
            else:
                found.append(Path(pattern))
    out: list[Path] = []
    for path in found:
        if path not in out:
            out.append(path)
    return out


def check_readable(path: Path, *, source: str | None = None) -> int:
    """Size of a regular readable file; PolicyNotFound (66) / PermissionDenied (77) / 65."""
    try:
        # O_NONBLOCK: a FIFO opened for reading would otherwise wait for a writer forever
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError as err:
        raise PolicyNotFound(
            f"prefetch file not found: {path}",
            file=source,
            field="prefetch.files",
            hint="check the model path (-m) or prefetch.files",
        ) from err
    except PermissionError as err:
        raise PermissionDenied(
            "prefetch file is not readable",
            file=str(path),
            errno=err.errno,
            hint="the governor reads the model before it drops privileges: check its mode",
        ) from err
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise PolicyError(
            f"prefetch file is not a regular file: {path}", file=source, field="prefetch.files"
        )
    return st.st_size
