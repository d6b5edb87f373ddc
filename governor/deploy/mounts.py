"""The host paths an engine's container mounts (`governor render k8s` hostPath volumes, `render
quadlet` Volume=): normalised and confined. A path from the argv is absolute and has no ``..``
(the container resolves it against its own tree); a file in ``/`` or a system directory is
mounted alone, never its directory (``-m /q4.gguf`` must not mount the host's root). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from governor.errors import PolicyError

# directories of the host that a hostPath never mounts whole (over the image's own, or the
# host's root itself): the file the argv names is mounted alone instead
SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/usr", "/usr/bin", "/usr/sbin",
     "/usr/lib", "/usr/local", "/usr/local/bin", "/usr/local/sbin", "/usr/local/lib", "/etc",
     "/var", "/var/lib", "/run", "/tmp", "/proc", "/sys", "/dev", "/boot", "/root", "/home",
     "/opt", "/srv", "/mnt", "/media"]
)  # fmt: skip
Mount = tuple[str, str, str]  # (volume name, host path = mount path, hostPath type)


def host_path(path: str, what: str) -> PurePosixPath:
    """``path`` from the argv as a hostPath: absolute, no ``..`` (the container resolves it
    against its own tree, where the directories it climbs out of need not exist), ``.`` and
    repeated slashes removed (PurePosixPath; a leading ``//`` too)."""
    if not path.startswith("/") or ".." in path.split("/"):
        raise PolicyError(
            f"{what} {path[:80]!r} cannot be a hostPath: it must be absolute, without '..'",
            file="engine argv",
            field=what,
            hint="name the file by its absolute path on the board, e.g. -m /models/q4.gguf",
        )
    return PurePosixPath("/" + path.lstrip("/"))


def host_mounts(argv: Sequence[str], models: Sequence[str]) -> list[Mount]:
    """The host paths a container needs, each mounted at its own path: the directory of the
    model (every part of a split GGUF) and of an absolute engine binary; a file alone when its
    directory is one of :data:`SYSTEM_DIRS` (``-m /q4.gguf`` never mounts the host's ``/``)."""
    files = [("model", host_path(m, "-m/--model")) for m in models]
    if argv and argv[0].startswith("/"):
        files.append(("engine", host_path(argv[0], "engine program")))
    out: list[Mount] = []
    for name, file in files:
        parent = str(file.parent)
        mount = (str(file), "File") if parent in SYSTEM_DIRS else (parent, "Directory")
        if mount[0] not in {m[1] for m in out}:
            taken = sum(1 for m in out if m[0].partition("-")[0] == name)
            out.append((f"{name}-{taken}" if taken else name, *mount))
    return out
