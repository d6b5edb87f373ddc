"""The compiled plan of a launch, cached: a repeated `governor launch` never imports the
compile-time stack (pydantic policy, compiler, GGUF reader).

An entry holds what compile time produced for one (policy, engine argv, options) on one host:
the Plan, the preflight's outcome (warnings, the GGUF estimate, the prefetch files and their
size) and the identity of every input it read. Its name is a hash of

    the governor's code (version, plan format, size and mtime of every module),
    the policy file's path and bytes, the working directory, the options,
    the words of the engine argv a compile reads and the engine's LLAMA_ARG_* variables
    (governor/plan/llama_args.py: not the prompt, seed, sampling, --host/--port),

and it is used only when what the name cannot cover still holds: the host facts the compiler
used (the cgroup2 mount, its controllers, CPUs, MemTotal, kernel, PSI, systemd; not MemAvailable,
not which controllers are switched on: the backend enables those at apply), the bytes of every
policy in the ``extends`` chain, and the (device, inode, size, mtime) of the model and prefetch
files. Anything else is a miss: compile, then store. Refusals are never cached: they are raised
again by the next compile. The cache is trusted only when it is safe to read as root
(governor/cache/store.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.cache.store import cache_dir, read_entry, write_entry
from governor.record import record

if TYPE_CHECKING:
    from hashlib import sha256
else:
    try:  # the builtin module: hashlib would map OpenSSL's libcrypto (~4 MiB) for this
        from _sha256 import sha256
    except ImportError:  # pragma: no cover - Pythons built without it
        from hashlib import sha256
from governor import __version__
from governor.log import get_logger
from governor.plan.host import HostFacts, probe
from governor.plan.llama_args import Unkeyable, compile_env, compile_words
from governor.plan.model import FORMAT, Plan

log = get_logger(__name__)

VERSION = __version__  # governor's version (governor/__init__.py); part of every cache key
SUBDIR = "plans"


@record(frozen=True)
class Compiled:
    """What launch needs from compile time (plain data; JSON in the cache)."""

    plan: Plan
    warnings: tuple[tuple[str, str], ...] = ()  # (event, message), logged at every launch
    estimate: dict[str, Any] | None = None  # engines.estimate.Estimate.to_dict()
    prefetch_files: tuple[str, ...] = ()
    prefetch_bytes: int = 0
    target: str | None = None  # the cgroup path probed for the host facts
    chain: tuple[tuple[str, str], ...] = ()  # (policy file, sha256) of the extends chain
    inputs: tuple[tuple[str, int, int, int, int], ...] = ()  # (path, dev, ino, size, mtime_ns)
    host_key: str = ""
    # --backend systemd: (mode, unit, unit cgroup, the plan applied inside it) for the service
    # and the transient scope, compiled ahead (governor/plan/placement.py compile_placements)
    placements: tuple[tuple[str, str, str, Plan], ...] = ()
    model_bytes: int | None = None  # the engine's model file(s), for the published state
    # the URL that answers 200 once the engine is ready (engine.ready, or llama-server's
    # --host/--port); None: ready once exec'd
    ready_url: str | None = None
    # llama-server with no engine.ready: its /health URL comes from --host/--port at every
    # launch (they are not part of the cache key)
    ready_server: bool = False
    from_cache: bool = False

    def to_json(self) -> bytes:
        d = {
            "plan": self.plan.to_dict(),
            "warnings": [list(w) for w in self.warnings],
            "estimate": self.estimate,
            "prefetch_files": list(self.prefetch_files),
            "prefetch_bytes": self.prefetch_bytes,
            "target": self.target,
            "chain": [list(c) for c in self.chain],
            "inputs": [list(i) for i in self.inputs],
            "host_key": self.host_key,
            "placements": [[m, u, c, p.to_dict()] for m, u, c, p in self.placements],
            "model_bytes": self.model_bytes,
            "ready_url": self.ready_url,
            "ready_server": self.ready_server,
        }
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Compiled:
        d = json.loads(raw)
        return cls(
            plan=Plan.from_dict(d["plan"]),
            warnings=tuple((str(e), str(m)) for e, m in d["warnings"]),
            estimate=d["estimate"],
            prefetch_files=tuple(d["prefetch_files"]),
            prefetch_bytes=int(d["prefetch_bytes"]),
            target=d["target"],
            chain=tuple((str(p), str(h)) for p, h in d["chain"]),
            inputs=tuple((str(p), *map(int, rest)) for p, *rest in d["inputs"]),  # type: ignore[misc]  # 5 fields
            host_key=d["host_key"],
            placements=tuple(
                (str(m), str(u), str(c), Plan.from_dict(p)) for m, u, c, p in d["placements"]
            ),
            model_bytes=d.get("model_bytes"),
            ready_url=d.get("ready_url"),
            ready_server=bool(d.get("ready_server", False)),
            from_cache=True,
        )


def code_identity() -> str:
    """Version, plan format and (name, size, mtime) of every governor module: an edited
    checkout (editable install) never runs with a plan compiled by older code."""
    h = sha256(f"{VERSION}|{FORMAT}".encode())
    top = Path(__file__).parent
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                st = os.stat(os.path.join(dirpath, name))
                h.update(f"{dirpath}/{name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def host_key(host: HostFacts) -> str:
    """The host facts the compiled plan depends on (volatile ones left out)."""
    d = host.to_dict()
    for volatile in ("mem_available", "subtree_control", "euid"):
        d.pop(volatile, None)
    for level in d.get("path", []):
        level.pop("subtree_control", None)
    return sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def file_identity(path: str) -> tuple[str, int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def sha256_file(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return sha256(f.read()).hexdigest()
    except OSError:
        return None


def entry_name(
    policy: Path,
    argv: Sequence[str],
    *,
    options: Sequence[str],
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> str | None:
    """The entry's file name; None when the policy cannot be read or the argv holds what the
    compile refuses in a part the key leaves out (the compile says why)."""

    try:
        text = policy.read_bytes()
        words = compile_words(argv)
        variables = compile_env(os.environ if env is None else env)
    except (OSError, Unkeyable):
        return None
    h = sha256()
    for part in (
        code_identity(),
        str(policy.resolve()),
        sha256(text).hexdigest(),
        json.dumps(words),
        json.dumps(variables),
        str(cwd),
        json.dumps(list(options)),
    ):
        h.update(part.encode(errors="surrogateescape") + b"\0")
    return h.hexdigest()[:40] + ".json"


def lookup(
    name: str,
    *,
    root: Path,
    cgroup_root: Path | None,
    directory: Path | None = None,
    sysfs_root: Path | None = None,
) -> tuple[Compiled, HostFacts] | None:
    """The cached entry when every input still holds, with the host facts probed to check it."""
    raw = read_entry((directory or cache_dir()) / SUBDIR, name)
    if raw is None:
        return None
    try:
        entry = Compiled.from_json(raw)
    except (ValueError, KeyError, TypeError) as err:
        log.debug("plan_cache.unreadable", entry=name, error=str(err))
        return None
    for path, digest in entry.chain:
        if sha256_file(path) != digest:
            return None
    for ident in entry.inputs:
        if file_identity(ident[0]) != ident:
            return None
    host = probe(root, cgroup_root=cgroup_root, target=entry.target, sysfs_root=sysfs_root)
    if host_key(host) != entry.host_key:
        return None
    return entry, host


def store(name: str, entry: Compiled, *, directory: Path | None = None) -> bool:
    ok = write_entry((directory or cache_dir()) / SUBDIR, name, entry.to_json())
    log.debug("plan_cache.stored" if ok else "plan_cache.not_stored", entry=name)
    return ok
