"""The drop-in `governor tune --persist` writes on an installed policy's slice unit: its name
(45-governor-tune.conf, which `governor uninstall` also removes), its text, the atomic write and
the restore `governor rollback` and the --confirm reverter use. Standard library only (the
reverter runs it)."""

from __future__ import annotations

import contextlib
import difflib
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from governor.backends.systemd import daemon_reload


def write_atomic(path: str, text: str, mode: int) -> None:

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".governor-tune-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def udiff(old: str, new: str, path: str) -> str:

    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), path, path
        )
    )


# before systemd's runtime 50-<Directive>.conf: a later runtime tune (set-property --runtime)
# wins over the persisted value, as it does live; `governor uninstall` removes it with the policy
DROPIN_NAME = "45-governor-tune.conf"
DROPIN_HEADER = (
    "# Written by `governor tune --persist`: limits changed on the live board, kept across\n"
    "# daemon-reload, restarts and reboots. `governor rollback` restores the previous file.\n"
)


def render_dropin(old: str | None, section: str, settings: Mapping[str, str]) -> str:
    """The tune drop-in with ``settings`` (directive -> value) merged into what it held."""
    held: dict[str, str] = {}
    for line in (old or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", "[")):
            held[key.strip()] = value.strip()
    held.update(settings)
    body = "".join(f"{k}={v}\n" for k, v in held.items())
    return f"{DROPIN_HEADER}[{section}]\n{body}"


def persist_dropin(path: str, section: str, settings: Mapping[str, str]) -> dict[str, Any]:
    """Write ``settings`` into the unit's tune drop-in (atomic). Returns {path, before, diff}:
    ``before`` is the previous text (None: there was none) for rollback."""

    try:
        with open(path) as f:
            old: str | None = f.read()
    except FileNotFoundError:
        old = None
    new = render_dropin(old, section, settings)
    if new == old:
        return {"path": path, "before": old, "diff": ""}
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, new, 0o644)
    return {"path": path, "before": old, "diff": udiff(old or "", new, path)}


def restore_dropin(info: Mapping[str, Any]) -> None:
    """Put a tune drop-in back as it was before a persisted tune, then reload the manager."""

    path, before = info["path"], info.get("before")
    if before is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))  # only when empty
    else:
        write_atomic(path, before, 0o644)
    daemon_reload()
