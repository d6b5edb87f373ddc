"""Runtime state: what each supervisor (and `governor apply`) publishes under
``/run/governor/<name>/state.json``, and the reader that `governor status` uses.

The file is written atomically (temp file + rename in the same directory) when the run starts,
when a rule changes state or fires, and at a restart; it is removed when the run ends. It is
never trusted blindly: a state whose ``pid`` is gone (or is no longer a governor) is reported as
*stale*. Times are wall-clock epoch seconds so that another process can compare them with its
own clock. The run time writes it with the standard library only.

Where: ``$GOVERNOR_RUN_DIR`` if set, else ``/run/governor`` for root, else
``$XDG_RUNTIME_DIR/governor``. Without XDG_RUNTIME_DIR a non-root user gets an error (69), not a
fallback: a fixed name in a shared /tmp (``/tmp/governor-<uid>``) can be made first by another
user, who then owns, reads or replaces the states and journals `status`, `tune` and `rollback`
trust; and a private random directory could not be found by the next command.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from governor.errors import HostError, PolicyNotFound
from governor.record import field, fields, record

STATE_FILE = "state.json"
FORMAT = 1


@record(frozen=True)
class RunState:
    """THE run-state record: what a supervisor (``source`` "launch"), `governor monitor`
    ("monitor") or `governor apply` ("apply") publishes in state.json, built once per publish
    here and nowhere else. :meth:`to_json` is the file's object: which keys each source writes
    (and in which order) is the stable format status, top, metrics and tune read."""

    policy: str
    source: str  # launch, monitor, apply
    policy_path: str | None
    pid: int | None  # the publishing governor (None: apply, no process)
    started_at: float
    backend: str | None
    cgroup_root: str
    group: str
    leaf: str
    plan: dict[str, Any]
    policy_sha256: str | None = None
    engine_pid: int | None = None
    restarts: int = 0
    model_bytes: int | None = None
    rules: list[dict[str, Any]] = field(default_factory=list)
    last_actions: list[dict[str, Any]] = field(default_factory=list)
    action_totals: list[dict[str, Any]] = field(default_factory=list)
    model: dict[str, Any] | None = None  # the GGUF estimate's model, quant and total
    prefetch_files: list[str] = field(default_factory=list)
    systemd: dict[str, Any] | None = None  # the unit carrying the limits (backends/manager.py)
    created: list[str] | None = None  # what `governor remove` may take away (apply, --keep)
    kept_by: str | None = None  # "launch --keep": the group outlived the run
    # the engine's readiness (engine.ready / llama-server's /health): None when it is ready once
    # exec'd, False while loading, True once it answered 200
    ready: bool | None = None
    # the board at the engine's start, for its unaccounted memory (backends/device.py)
    board: dict[str, int] | None = None
    # [qos] (issue 23): {"class": ..., "yield": [...]}, and the steps this policy's `shed` took
    # per victim ({"victim", "step", "count"}: the metric governor_shed_total)
    qos: dict[str, Any] | None = None
    shed_totals: list[dict[str, Any]] = field(default_factory=list)
    stale: bool = False  # set by the reader (read_states), never written

    @classmethod
    def read(cls, state: Mapping[str, Any]) -> RunState:
        """A state as read back (read_states, or the one a supervisor serves /metrics from):
        another process wrote it, so its values pass as they are and a key it lacks has its
        default (None for the ones every writer sets: a reader skips a state without a plan)."""
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = dict.fromkeys(_REQUIRED)
        values.update((k, v) for k, v in state.items() if k in known)
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The state file's object (without ``format``, which Publisher adds)."""
        out: dict[str, Any] = {}
        for key in _KEYS[self.source]:
            value = getattr(self, key)
            if value is None and key in _WHEN_SET and self.source != "launch":
                continue  # carried over from `governor apply`'s state only when it had it
            out[key] = round(value, 3) if key == "started_at" else value
        return out


# the keys each source writes, in its order (docs/status.schema.json documents what status
# makes of them)
_KEYS = {
    "launch": (
        "policy", "source", "policy_path", "policy_sha256", "pid", "engine_pid", "started_at",
        "backend", "cgroup_root", "group", "leaf", "restarts", "model_bytes", "rules",
        "last_actions", "action_totals", "model", "prefetch_files", "plan", "systemd", "ready",
        "board", "qos", "shed_totals",
    ),
    "monitor": (
        "policy", "source", "policy_path", "policy_sha256", "pid", "started_at", "backend",
        "cgroup_root", "group", "leaf", "restarts", "plan", "created", "systemd", "engine_pid",
        "rules", "last_actions", "action_totals", "qos", "shed_totals",
    ),
    "apply": (
        "policy", "source", "policy_path", "pid", "started_at", "backend", "cgroup_root",
        "group", "leaf", "plan", "created", "kept_by", "qos",
    ),
}  # fmt: skip
_WHEN_SET = frozenset({"created", "systemd", "kept_by"})
_REQUIRED = _KEYS["apply"][:10]  # what every writer sets (the fields without a default)


def run_dir(environ: Mapping[str, str] | None = None, *, euid: int | None = None) -> Path:
    """Where the states and journals live (module docstring); HostError (69) for a non-root
    user without XDG_RUNTIME_DIR (pam_systemd sets it at login: /run/user/<uid>, 0700)."""
    env = os.environ if environ is None else environ
    uid = os.geteuid() if euid is None else euid
    if env.get("GOVERNOR_RUN_DIR"):
        return Path(env["GOVERNOR_RUN_DIR"])
    if uid == 0:
        return Path("/run/governor")
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "governor"
    raise HostError(
        f"no run directory for uid {uid}: XDG_RUNTIME_DIR is not set and /run/governor is"
        " root's (XDG_RUNTIME_DIR, /run/governor)",
        hint="log in through a session that sets it (pam_systemd: /run/user/UID), or set"
        " GOVERNOR_RUN_DIR to a directory only you can write",
    )


class Publisher:
    """Writes one policy's state file; ``remove()`` at the end of the run."""

    def __init__(self, directory: Path, name: str) -> None:
        self.dir = directory / name
        self.path = self.dir / STATE_FILE
        # the monitor's thread and the main thread both publish: one temp file at a time
        self._lock = threading.Lock()

    def read(self) -> dict[str, Any] | None:
        """What is published under this name now (by anyone), None when nothing readable is."""
        try:
            state = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def publish(self, state: RunState | Mapping[str, Any]) -> bool:
        """Atomically replace the state file; False (never raises) when it cannot be written:
        publishing must not stop the engine. A mapping is a state read back (put back as is)."""
        with self._lock:
            return self._publish(state.to_json() if isinstance(state, RunState) else state)

    def _publish(self, state: Mapping[str, Any]) -> bool:
        data = json.dumps({"format": FORMAT, **state}, default=str).encode()
        tmp = self.dir / f".{STATE_FILE}.{os.getpid()}"
        try:
            self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        return True

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self.dir.rmdir()  # only when nothing else lives there (a journal stays)


def applied(
    plan_dict: Mapping[str, Any],
    *,
    policy_path: str | None,
    created: list[str],
    started_at: float,
    kept_by: str | None = None,
) -> RunState:
    """The state of a slice no process supervises (`governor apply`, a `launch --keep`'s
    group): it holds while the cgroup exists, and ``created`` is what `governor remove` may
    take away with the group (never an operator's own slice)."""
    return RunState(
        policy=plan_dict["policy"],
        source="apply",
        policy_path=policy_path,
        pid=None,
        started_at=started_at,
        backend="cgroupfs",
        cgroup_root=plan_dict["cgroup_root"],
        group=plan_dict["group"],
        leaf=plan_dict["leaf"],
        plan=dict(plan_dict),
        created=created,
        kept_by=kept_by,
        qos=_qos(plan_dict),
    )


def _qos(plan_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's [qos] as the policy spells it (a plan of before issue 23: standard)."""
    qos = plan_dict.get("qos") or {}
    return {
        "class": qos.get("qos_class", "standard"),
        "yield": list(qos.get("yields", ("throttle", "freeze", "stop", "kill"))),
    }


def alive(pid: int | None, proc: Path = Path("/proc"), *, marker: bytes = b"governor") -> bool:
    """``pid`` runs and is a governor (its command line has ``marker``: not a recycled pid of
    another program)."""
    if not pid:
        return False
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return marker in cmdline


REVERTER = b"governor.operate.confirm"  # the --confirm reverter's command line (governor/operate/confirm.py)


def read_states(directory: Path, proc: Path = Path("/proc")) -> list[dict[str, Any]]:
    """Every published state, with ``stale`` set from its pid (False for `apply`'s, which
    have no process: they hold while the cgroup exists)."""
    out: list[dict[str, Any]] = []
    try:
        names = sorted(p.name for p in directory.iterdir() if p.is_dir())
    except OSError:
        return out
    for name in names:
        try:
            state = json.loads((directory / name / STATE_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(state, dict):
            continue
        if state.get("source") == "apply":
            state["stale"] = False
        else:
            state["stale"] = not alive(state.get("pid"), proc)
        out.append(state)
    return out


def prune_stale(
    directory: Path, name: str | None = None, proc: Path = Path("/proc")
) -> list[tuple[str, Any]]:
    """Remove the published state of every stale entry (NAME's only, when given): (name, pid)
    of each removed. A journal in the same directory stays (tune history, rollback)."""
    pruned: list[tuple[str, Any]] = []
    for state in read_states(directory, proc):
        policy = state.get("policy")
        if not state["stale"] or not isinstance(policy, str) or name not in (None, policy):
            continue
        publisher = Publisher(directory, policy)
        again = publisher.read()  # a new run may have published since
        if again is None or again.get("pid") != state.get("pid"):
            continue
        publisher.remove()
        pruned.append((policy, state.get("pid")))
    return pruned


def states_of(directory: Path, name: str | None, *, hint: str) -> list[dict[str, Any]]:
    """:func:`read_states`, only NAME's when given: PolicyNotFound (66) when it has none."""
    states = read_states(directory)
    if name is not None:
        states = [s for s in states if s.get("policy") == name]
        if not states:
            raise PolicyNotFound(f"no governed slice named {name} ({directory})", hint=hint)
    return states
