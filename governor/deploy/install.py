"""`governor install` / `governor uninstall`: write the rendered units under a root, atomically,
with a manifest that lets uninstall remove exactly what install wrote and restore what it
replaced.

The manifest ``<root>/etc/governor/installed/<policy>.json`` lists every file with the text it
had before governor first wrote it (``null``: it did not exist) and the sha256 of what governor
wrote. Files shared by several policies (governor.slice, governor@.service) are listed in each
manifest; the last uninstall restores them. A file the operator edited after install is left
alone (and reported). Writes are temp + fsync + rename + fsync(dir); nothing here talks to
systemd: the caller passes ``reload``.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from governor.atomic import write_atomic
from governor.deploy.dropin import UNIT_DIR, UnitFile
from governor.deploy.tunedropin import DROPIN_NAME
from governor.errors import BackendError, PermissionDenied, PolicyError, PolicyNotFound
from governor.log import get_logger
from governor.peer.files import CappedReadError, read_capped
from governor.policy.model import NAME_RE

log = get_logger(__name__)

MANIFEST_DIR = "etc/governor/installed"
FILE_MODE = 0o644
FILE_MAX = 1 << 20  # a unit, a drop-in or a manifest: KiB (board/scan.py MANIFEST_MAX)
DIR_MODE = 0o755


def _under_root(rel: str) -> str:
    """A manifest path must stay under the install root: relative, no `..`, no NUL."""
    parts = Path(rel).parts
    if not rel or "\0" in rel or Path(rel).is_absolute() or ".." in parts or rel != "/".join(parts):
        raise ValueError(f"path {rel[:80]!r} is not a plain path under the install root")
    return rel


class ManifestFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str  # relative to the root
    sha256: str  # of the text governor wrote
    previous: str | None  # the text before governor first wrote it; None = did not exist
    written: bool  # False: it already held exactly this text (not governor's to remove)

    @field_validator("path")
    @classmethod
    def _path_under_root(cls, value: str) -> str:
        return _under_root(value)


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str
    units: tuple[str, ...]
    files: tuple[ManifestFile, ...]
    created_dirs: tuple[str, ...] = ()  # parents first
    # the slice's claim on the board (governor/board/budget.py plan_claim_dict; issue 36): an
    # installed service that does not run keeps it (governor/board/scan.py reads it)
    claim: dict[str, Any] | None = None

    @field_validator("created_dirs")
    @classmethod
    def _dirs_under_root(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_under_root(d) for d in value)


@dataclass(frozen=True)
class Change:
    path: str  # relative to the root
    old: str | None
    new: str | None  # None: removed


@dataclass
class Result:
    changes: list[Change]
    units: list[str]
    manifest: str
    reloaded: str | None = None  # how the manager was reloaded, None when nothing changed
    kept: list[str] = field(default_factory=list)  # files left alone (edited since install)

    def diff(self) -> str:
        return unified_diff(self.changes)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def unified_diff(changes: Sequence[Change]) -> str:
    out: list[str] = []
    for c in changes:
        out.extend(
            difflib.unified_diff(
                (c.old or "").splitlines(keepends=True),
                (c.new or "").splitlines(keepends=True),
                fromfile="/dev/null" if c.old is None else f"a/{c.path}",
                tofile="/dev/null" if c.new is None else f"b/{c.path}",
            )
        )
    return "".join(out)


# --- file system -----------------------------------------------------------------------------


def _oserror(err: OSError, action: str, path: Path) -> BackendError | PermissionDenied:
    cls = PermissionDenied if isinstance(err, PermissionError) else BackendError
    return cls(action, file=str(path), errno=err.errno, hint="run as root, or pass --root DIR")


def _masked(path: Path) -> bool:
    try:
        return path.is_symlink() and os.readlink(path) == os.devnull
    except OSError:
        return False


def _read(path: Path, *, follow: bool = True) -> str | None:
    """The text of a file install writes or replaces (a unit, a drop-in, a manifest), None
    when it does not exist. A FIFO, a device, a file over ``FILE_MAX`` (a symlink where
    ``follow`` is False: a manifest) is refused before any of it is read."""
    try:
        raw = read_capped(path, FILE_MAX, follow=follow)
    except FileNotFoundError:
        return None
    except CappedReadError as err:
        if _masked(path):  # systemctl mask: a symlink to /dev/null the operator made
            raise PolicyError(
                "the unit is masked (a symlink to /dev/null); not replacing it",
                file=str(path),
                hint=f"`systemctl unmask {path.name}` if it should run, then install again",
            ) from None
        raise PolicyError(
            f"existing file is {err.problem}; not replacing it",
            file=str(path),
            hint="look at the file: move it aside if it is not needed, then install again",
        ) from None
    except OSError as err:
        raise _oserror(err, "cannot read", path) from err
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        # install keeps the old text to restore it on uninstall: it cannot keep what it
        # cannot read back exactly, so it leaves the file alone
        raise PolicyError(
            f"existing file is not UTF-8 text (byte {err.start}); not replacing it",
            file=str(path),
            hint="look at the file: move it aside if it is not needed, then install again",
        ) from None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash leaves the old or the new file, never half."""
    try:
        write_atomic(path, text, FILE_MODE, durable=True)
    except OSError as err:
        raise _oserror(err, "cannot write", path) from err


def _remove(path: Path) -> None:
    try:
        path.unlink()
        _fsync_dir(path.parent)
    except FileNotFoundError:
        pass
    except OSError as err:
        raise _oserror(err, "cannot remove", path) from err


def _makedirs(root: Path, rel: str, created: list[str]) -> None:
    parts = Path(rel).parts
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        target = root / sub
        if target.is_dir():
            continue
        try:
            target.mkdir(mode=DIR_MODE)
        except OSError as err:
            raise _oserror(err, "cannot create directory", target) from err
        created.append(sub)


# --- manifests -------------------------------------------------------------------------------


def check_name(policy: str) -> str:
    """A policy name as install/uninstall take it: the policy-name pattern, nothing path-like."""
    if not NAME_RE.fullmatch(policy):
        raise PolicyError(
            f"{policy[:80]!r} is not a policy name (POLICY)",
            hint="a name is 1-63 of a-z 0-9 _ - starting with a letter or digit, as the"
            " policy's `name`",
        )
    return policy


def manifest_path(root: Path, policy: str) -> Path:
    return root / MANIFEST_DIR / f"{check_name(policy)}.json"


def _load_manifest(path: Path) -> Manifest | None:
    text = _read(path, follow=False)  # install writes it as a file: a symlink is not its
    if text is None:
        return None
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "manifest"
        raise PolicyError(
            f"install manifest is corrupt: {first['msg']} ({path}, {where})",
            hint="restore it from a backup or remove the policy's units by hand and delete"
            " the manifest; governor will not guess which files it owns",
        ) from None


def _others(root: Path, policy: str) -> list[Manifest]:
    """Every OTHER policy's manifest."""
    directory = root / MANIFEST_DIR
    if not directory.is_dir():
        return []
    found = (_load_manifest(p) for p in sorted(directory.glob("*.json")) if p.stem != policy)
    return [m for m in found if m is not None]


def _other_entries(root: Path, policy: str) -> dict[str, ManifestFile]:
    """path -> entry from every OTHER policy's manifest (shared files)."""
    out: dict[str, ManifestFile] = {}
    for m in _others(root, policy):
        for f in m.files:
            out.setdefault(f.path, f)
    return out


def _ancestors(rel: str) -> list[str]:
    parts = Path(rel).parts
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


# --- install / uninstall ---------------------------------------------------------------------


def install(
    policy: str,
    files: Sequence[UnitFile],
    units: Sequence[str],
    *,
    root: Path,
    dry_run: bool = False,
    reload: Callable[[], str] | None = None,
    claim: dict[str, Any] | None = None,
) -> Result:
    """Write ``files`` under ``root``; idempotent (nothing changes the second time).
    ``claim``: recorded in the manifest (the board's admission counts it)."""
    manifest_file = manifest_path(root, policy)
    rel_manifest = str(manifest_file.relative_to(root))
    own = _load_manifest(manifest_file)
    own_entries = {f.path: f for f in own.files} if own else {}
    others = _other_entries(root, policy)

    changes: list[Change] = []
    entries: list[ManifestFile] = []
    for uf in files:
        current = _read(root / uf.path)
        mine, theirs = own_entries.get(uf.path), others.get(uf.path)
        base = mine or theirs
        previous = base.previous if base is not None else current
        written = current != uf.text or bool(base and base.written)
        entries.append(
            ManifestFile(path=uf.path, sha256=_sha(uf.text), previous=previous, written=written)
        )
        if current != uf.text:
            changes.append(Change(uf.path, current, uf.text))
    # files an earlier install of this policy wrote that are not wanted any more
    wanted = {uf.path for uf in files}
    stale = [f for f in (own.files if own else ()) if f.path not in wanted]
    stale_changes, kept = _undo(root, stale, others, dry_run=True)
    changes += stale_changes
    result = Result(changes=changes, units=list(units), manifest=rel_manifest, kept=kept)
    if dry_run:
        return result

    created: list[str] = list(own.created_dirs) if own else []
    # directories another policy's install created and ours needs too: the last uninstall
    # removes them
    needed = {d for uf in files for d in _ancestors(str(Path(uf.path).parent))}
    needed |= set(_ancestors(MANIFEST_DIR))
    shared = {d for m in _others(root, policy) for d in m.created_dirs} & needed
    created += sorted(shared - set(created), key=lambda d: d.count("/"))
    for uf in files:
        _makedirs(root, str(Path(uf.path).parent), created)
    for c in changes:
        if c.new is not None:
            atomic_write(root / c.path, c.new)
            log.info("install.write", file=c.path)
    _undo(root, stale, others, dry_run=False)
    _makedirs(root, MANIFEST_DIR, created)
    manifest = Manifest(
        policy=policy,
        units=tuple(units),
        files=tuple(entries),
        created_dirs=tuple(created),
        claim=claim,
    )
    new_manifest = manifest.model_dump_json(indent=2) + "\n"
    if _read(manifest_file) != new_manifest:
        atomic_write(manifest_file, new_manifest)
    if changes and reload is not None:
        result.reloaded = reload()
    return result


def _undo(
    root: Path, entries: Sequence[ManifestFile], others: dict[str, ManifestFile], *, dry_run: bool
) -> tuple[list[Change], list[str]]:
    """Restore or remove what governor wrote; shared and operator-edited files stay."""
    changes: list[Change] = []
    kept: list[str] = []
    for f in entries:
        if not f.written or f.path in others:
            continue
        path = root / f.path
        current = _read(path)
        if current is None and f.previous is None:
            continue
        if current is not None and _sha(current) != f.sha256:
            kept.append(f.path)
            log.warning("uninstall.kept_edited", file=f.path)
            continue
        changes.append(Change(f.path, current, f.previous))
        if dry_run:
            continue
        if f.previous is None:
            _remove(path)
        else:
            atomic_write(path, f.previous)
        log.info("uninstall.restore" if f.previous is not None else "uninstall.remove", file=f.path)
    return changes, kept


def _tune_dropins(root: Path, units: Sequence[str], *, dry_run: bool) -> list[Change]:
    """The drop-ins `governor tune --persist` wrote on the policy's slice go with the policy."""
    out: list[Change] = []
    for unit in units:
        path = root / UNIT_DIR / f"{unit}.d" / DROPIN_NAME
        text = _read(path)
        if text is None:
            continue
        out.append(Change(str(path.relative_to(root)), text, None))
        if not dry_run:
            _remove(path)
            with contextlib.suppress(OSError):
                path.parent.rmdir()
    return out


def uninstall(
    policy: str,
    *,
    root: Path,
    dry_run: bool = False,
    reload: Callable[[], str] | None = None,
) -> Result:
    manifest_file = manifest_path(root, policy)
    own = _load_manifest(manifest_file)
    if own is None:
        raise PolicyNotFound(
            f"policy {policy} is not installed (no {manifest_file})",
            hint="`governor install POLICY` first; --root must match the one install used",
        )
    others = _other_entries(root, policy)
    changes, kept = _undo(root, own.files, others, dry_run=dry_run)
    changes += _tune_dropins(root, own.units, dry_run=dry_run)
    result = Result(
        changes=changes,
        units=list(own.units),
        manifest=str(manifest_file.relative_to(root)),
        kept=kept,
    )
    if dry_run:
        return result
    _remove(manifest_file)
    for d in sorted(own.created_dirs, key=lambda d: d.count("/"), reverse=True):
        with contextlib.suppress(OSError):  # not empty: something else lives there now
            (root / d).rmdir()
    if changes and reload is not None:
        result.reloaded = reload()
    return result
