"""The state directory and its one per-model file, ``models.json``: what governed runs measured
of each model file, so that the next ``estimate``, ``init``, admission and the evictor stand on
it, across reboots.

Where: ``$GOVERNOR_STATE_DIR``, else ``/var/lib/governor`` for root (systemd's
``StateDirectory=governor``: data that must survive a reboot; the run dir ``/run/governor`` is a
tmpfs and the cache dir may be wiped by the operator), else ``$XDG_STATE_HOME/governor``
(``~/.local/state/governor``).

A model is known by :func:`model_identity`, the file's size and a hash of its first
:data:`HEAD_BYTES`: a GGUF file's header (architecture, hyper-parameters, tensor types) and its
size are what its memory and load depend on, and both survive a reboot, a copy (``cp``, a new
inode and mtime), a move and a re-mount (9p, overlay: inodes differ), where the former keys
(size+mtime+inode, name+size+mtime) did not; a file rewritten with other content is a new model.

The file is one JSON object, ``{"format": 1, "models": {IDENTITY: ENTRY}}``, an ENTRY holding
``peaks`` (plan key -> runs: state/peaks.py) and ``load`` (state/costs.py) and ``at``, its last
record. Bounded: :data:`MODELS_MAX` entries (the most recently recorded kept),
:data:`PLANS_MAX` plans each, :data:`FILE_CAP` bytes (a bigger file is not read, and a write
drops the oldest entries until it fits). Read through one bounded reader in a trusted directory
(cache/store.py's rules: owned by this user or root, not writable by group or others), validated
entry by entry: a bad file or entry is one note and no data, never a crash. Written atomically
(atomic.py) under a lock beside it with a deadline (peer/lock.py).

The former files, ``<run dir>/peaks.json`` and ``<cache dir>/model-costs.json``, are not
migrated: their keys name no file and no content (inode and mtime; name, size and mtime), so
they cannot be re-keyed to :func:`model_identity`, and the first run of each model measures
again what they held (the peaks were on a tmpfs: at most the current boot's runs).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from governor.atomic import write_atomic
from governor.cache.store import trusted_dir
from governor.peer.files import read_capped
from governor.peer.lock import LockBusy, take

FILE = "models.json"
LOCK_FILE = ".models.lock"
FORMAT = 1
MODELS_MAX = 64  # model files kept, the ones recorded last: a board runs a handful
PLANS_MAX = 8  # plan keys kept per model, the ones recorded last
RUNS_MAX = 8  # the last runs kept per plan: the learned peak is their highest
PLAN_KEY_MAX = 4096  # a longer plan key (an argv of thousands of words) is not recorded
MAX_LOAD_S = 24 * 3600.0  # a load that "took" longer is no measurement
FILE_CAP = 1 << 20  # bytes: a bigger file is not read, a write drops old entries to fit
IDENTITY_MAX = 128
HEAD_BYTES = 256 * 1024  # hashed: a GGUF's key-values and most tensor infos; ~1 ms of sha256
LOCK_WAIT_S = 2.0

Entry = dict[str, Any]


def state_dir(environ: Mapping[str, str] | None = None, *, euid: int | None = None) -> Path:
    """Where the per-model store lives (module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("GOVERNOR_STATE_DIR"):
        return Path(env["GOVERNOR_STATE_DIR"])
    if (os.geteuid() if euid is None else euid) == 0:
        return Path("/var/lib/governor")
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "governor"


@functools.lru_cache(maxsize=64)
def _hashed(path: str, dev: int, ino: int, size: int, mtime_ns: int) -> str | None:
    """The identity of the file stat said this is (cached: a router hashes at every load)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.pread(fd, HEAD_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return f"{size}-{hashlib.sha256(head).hexdigest()[:32]}"


def model_identity(model: str | Path) -> str | None:
    """``SIZE-SHA256`` of the file's size and first HEAD_BYTES (module docstring); None when it
    is no regular file or cannot be read."""
    try:
        st = os.stat(model)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return _hashed(os.fspath(model), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def is_time(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def is_size(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def check_plan(entry: object) -> str | None:
    """What is wrong with one plan's runs (None: what state/peaks.py writes)."""
    if not isinstance(entry, dict):
        return "a plan is not an object"
    runs = entry.get("runs")
    if not isinstance(runs, list) or not runs or not all(is_size(r) for r in runs):
        return "runs is not a list of byte counts"
    if len(runs) > RUNS_MAX:
        return f"more than {RUNS_MAX} runs"
    est = entry.get("estimate")
    if est is not None and not is_size(est):
        return "estimate is not a byte count"
    if not is_time(entry.get("at")):
        return "at is not a time"
    if not isinstance(entry.get("said", False), bool):
        return "said is not a bool"
    return None


def check_load(load: object) -> str | None:
    """What is wrong with one measured load (None: what state/costs.py writes)."""
    if not isinstance(load, dict):
        return "load is not an object"
    load_s, size = load.get("load_s"), load.get("bytes")
    if not is_time(load_s) or not 0 <= load_s <= MAX_LOAD_S:  # type: ignore[operator]  # a number
        return f"load_s is not seconds up to {MAX_LOAD_S:.0f}"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return "bytes is not a byte count"
    if not is_time(load.get("at")):
        return "at is not a time"
    return None


def check(entry: Entry) -> tuple[Entry, str | None]:
    """The valid parts of one model's entry and what was dropped (None: nothing)."""
    kept: Entry = {}
    problem = None
    peaks = entry.get("peaks", {})
    if not isinstance(peaks, dict) or len(peaks) > PLANS_MAX:
        problem = f"peaks is not an object of at most {PLANS_MAX} plans"
        peaks = {}
    plans = {}
    for key, plan in peaks.items():
        wrong = check_plan(plan) if len(key) <= PLAN_KEY_MAX else "plan key too long"
        if wrong is None:
            plans[key] = plan
        else:
            problem = problem or f"plan {key[:40]!r}: {wrong}"
    if plans:
        kept["peaks"] = plans
    if "load" in entry:
        wrong = check_load(entry["load"])
        if wrong is None:
            kept["load"] = entry["load"]
        problem = problem or wrong
    return kept, problem


def parse(raw: bytes) -> tuple[dict[str, Entry], str | None]:
    """The entries of a store's bytes (pure) and what was wrong with it: a file that is not a
    store gives none, a bad part of an entry is dropped (:func:`check`). ValueError never
    escapes."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {}, "not UTF-8"
    except ValueError as err:
        return {}, f"not JSON ({err})"
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(models, dict):
        return {}, f"not a store of format {FORMAT}"
    out: dict[str, Entry] = {}
    problem = None
    for key, entry in models.items():
        if len(key) > IDENTITY_MAX or not isinstance(entry, dict) or not is_time(entry.get("at")):
            problem = problem or f"entry {key[:40]!r} is not an object with a time"
            continue
        kept, wrong = check(entry)
        problem = problem or (None if wrong is None else f"entry {key[:40]!r}: {wrong}")
        out[key] = {**kept, "at": entry["at"]}
    return newest(out), problem


def newest(models: dict[str, Entry]) -> dict[str, Entry]:
    """At most MODELS_MAX entries, the ones recorded last."""
    keep = sorted(models.items(), key=lambda kv: (-kv[1]["at"], kv[0]))[:MODELS_MAX]
    return dict(keep)


def render(models: dict[str, Entry]) -> bytes:
    """The file (pure): MODELS_MAX entries at most, the oldest dropped until it fits FILE_CAP."""
    keep = newest(models)
    while True:
        out = json.dumps({"format": FORMAT, "models": keep}, sort_keys=True).encode() + b"\n"
        if len(out) <= FILE_CAP or not keep:
            return out
        del keep[min(keep, key=lambda k: keep[k]["at"])]


class Store:
    """The per-model file in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FILE

    def read(self) -> tuple[dict[str, Entry], str | None]:
        """Every entry kept and a note naming what was wrong (a bad file: one note)."""
        if not self.directory.exists():
            return {}, None
        if not trusted_dir(self.directory):
            return {}, f"{self.directory}: not a directory only its owner can write: not read"
        try:
            raw = read_capped(self.path, FILE_CAP, follow=False)
        except FileNotFoundError:
            return {}, None
        except OSError as err:
            return {}, f"{self.path}: {err.strerror or err}: not read"
        models, problem = parse(raw)
        note = (
            None
            if problem is None
            else f"{self.path}: {problem}: left out (the next run replaces it)"
        )
        return models, note

    def update(
        self,
        identity: str,
        change: Callable[[Entry], Entry],
        *,
        now: float | None = None,
        lock_wait_s: float = LOCK_WAIT_S,
    ) -> Entry:
        """Apply ``change`` to ``identity``'s entry ({} when new) under the lock and write the
        file atomically; the changed entry. OSError (an untrusted directory too) and LockBusy
        pass: the caller logs them."""
        with contextlib.suppress(OSError):
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        if not trusted_dir(self.directory):
            raise PermissionError(f"{self.directory}: not a directory only its owner can write")
        fd = take(self.directory / LOCK_FILE, deadline=time.monotonic() + lock_wait_s)
        try:
            models, _note = self.read()  # a bad file or entry is replaced
            entry = {
                **change(dict(models.pop(identity, {}))),
                "at": time.time() if now is None else now,
            }
            models[identity] = entry
            write_atomic(self.path, render(models), 0o644)
            return entry
        finally:
            os.close(fd)


__all__ = ["LockBusy", "Store", "model_identity", "state_dir"]
