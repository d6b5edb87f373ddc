"""The engine's executable, found like execvp would find it, before anything is applied:
127 when it is not there, 126 when it cannot be executed (the shell's codes)."""

from __future__ import annotations

import os

from governor.errors import LaunchError


def which(name: str, path_env: str | None) -> str | None:
    """The first $PATH entry holding ``name`` (execvp's search; shutil.which without the
    imports it pulls: bz2, lzma, fnmatch)."""
    for directory in (path_env if path_env is not None else os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.exists(candidate) and not os.path.isdir(candidate):
            return candidate
    return None


def resolve_executable(argv0: str, path_env: str | None) -> str:
    """Find the engine like execvp would, before anything is applied (127 / 126)."""
    found = argv0 if "/" in argv0 else which(argv0, path_env)
    if found is None or not os.path.exists(found):
        raise LaunchError(
            f"engine not found: {argv0} (-- ENGINE)",
            exit_code=127,
            hint="give the engine's path after --, e.g. -- ./llama-completion -m model.gguf",
        )
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise LaunchError(
            f"engine is not executable: {found} (-- ENGINE)",
            exit_code=126,
            hint=f"chmod +x {found}",
        )
    return found
