"""Output files (--report, bench --csv/--json): checked BEFORE anything runs, so a typo in a path
is one error line up front, not a lost result after the engine ran; and `governor init`'s policy
file, written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from governor.errors import BackendError, PermissionDenied, PolicyNotFound, UsageError


def check_writable(path: Path, option: str) -> None:
    """Raise unless ``path`` can be written as a file: not a directory, its directory exists,
    and this user may write there. Nothing is created."""
    if path.is_dir():
        raise UsageError(
            f"{option} {path} is a directory ({option})",
            hint=f"give a file name: {option} {path / 'report.json'}",
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise PolicyNotFound(
            f"{option}: directory {parent} does not exist",
            file=str(path),
            hint=f"mkdir -p {parent}",
        )
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        raise PermissionDenied(
            f"{option}: cannot write",
            file=str(path),
            hint="choose a path this user can write, or run as its owner",
        )


def write_policy(path: Path, text: str, *, force: bool) -> None:
    """Write ``text`` to ``path`` whole or not at all (temp file + fsync + link/rename); an
    existing file is replaced only with ``force``. The link is the existence check: no race."""

    if (path.exists() or path.is_symlink()) and not force:  # the link below still decides
        raise _exists(path)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    except FileExistsError as err:
        raise _exists(path) from err
    except FileNotFoundError as err:
        raise PolicyNotFound(
            f"no such directory: {path.parent}",
            file=str(path),
            hint="create it, or choose another -o",
        ) from err
    except PermissionError as err:
        raise PermissionDenied("cannot write", file=str(path), errno=err.errno) from err
    except OSError as err:
        raise BackendError("cannot write", file=str(path), errno=err.errno) from err
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _exists(path: Path) -> UsageError:
    return UsageError(
        f"the output file exists; not overwriting it ({path})",
        hint="pass --force to replace it, or choose another -o",
    )
