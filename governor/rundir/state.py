"""Runtime state: what each supervisor (and `governor apply`) publishes under
``/run/governor/<name>/state.json``, and the reader that `governor status` uses.

The file is written atomically (temp file + rename in the same directory) when the run starts,
when a rule changes state or fires, and at a restart; it is removed when the run ends. It is
never trusted blindly: a state whose ``pid`` is gone (or is another process now: its start time
differs from the one published) is reported as *stale*, and so is an `apply` state whose cgroup is
gone. Times are wall-clock epoch seconds so that another process can compare them with its
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from governor.atomic import write_atomic
from governor.errors import HostError, PolicyNotFound
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.leafname import is_leaf
from governor.peer.files import read_capped
from governor.plan.model import Plan
from governor.record import check_types, field, fields, record, replace
from governor.rundir.journal import is_number
from governor.rundir.liveness import alive
from governor.rundir.verdicts import Verdicts

STATE_FILE = "state.json"
FORMAT = 1
# the largest state a reader takes: a router's with 64 models, its rules and action history is
# ~32 KiB (measured, issue 43): 4 MiB leaves a hundredfold
STATE_MAX = 4 << 20
_CHECKED = Verdicts()  # check_state's, per state's bytes: a scan re-reads unchanged states


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
    plan: Plan | None  # the compiled plan it runs, read once (None: a state without one)
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
    # llama-server's router (issue 38): {"url": "http://HOST:PORT", "models": {alias:
    # {"last_request": epoch | None, "leaf": its leaf under models/ (kernel/leafname.py; None:
    # it has none), "load_s" and "bytes": its measured load (issue 46, supervise/loads.py;
    # absent: not measured)}}, "unloads": [{"model", "reason", "count"}]}; a shed of this
    # slice unloads its least recently used idle model through the url (peer/router.py)
    router: dict[str, Any] | None = None
    # the publishing governor's start time (/proc/PID/stat starttime, clock ticks after boot):
    # with ``pid`` it names that process, a reused pid has another (None: a state of before
    # issue 43, whose liveness falls back to the command line)
    pid_start: int | None = None
    stale: bool = False  # set by the reader (read_states), never written

    @classmethod
    def read(cls, state: Mapping[str, Any]) -> RunState:
        """The record of a state file's object that :func:`check_state` passed (only
        :func:`load_state` reads one): a key it lacks has its default (None for the ones every
        writer sets: a reader skips a state without a plan); ``stale`` is the reader's."""
        known = {f.name for f in fields(cls)} - {"stale"}
        values: dict[str, Any] = dict.fromkeys(_REQUIRED)
        values.update((k, v) for k, v in state.items() if k in known)
        if isinstance(values["plan"], dict):
            values["plan"] = Plan.from_dict(values["plan"])
        return cls(**values)

    def router_models(self) -> tuple[str, dict[str, float | None]] | None:
        """llama-server's router as published: (its url, {model: last request epoch or
        None}); None when this run is no router (check_state checked the shape)."""
        router = self.router
        if not router or not isinstance(router.get("url"), str):
            return None
        models = router.get("models") or {}
        last = {
            a: (m.get("last_request") if isinstance(m, dict) else None) for a, m in models.items()
        }
        return router["url"], last

    def reload_s(self) -> float | None:
        """What bringing this run's models back costs: the sum of their measured load seconds
        as published (issue 46); None when none is measured (or this run is no router)."""
        models = (self.router or {}).get("models") or {}
        seen = [
            float(m["load_s"])
            for m in models.values()
            if isinstance(m, dict) and isinstance(m.get("load_s"), int | float)
        ]
        return sum(seen) if seen else None

    def model_leaves(self) -> dict[str, str]:
        """leaf -> model of the router's models as published (kernel/leafname.py's mapping;
        check_state checked each leaf); empty when this run is no router."""
        models = (self.router or {}).get("models") or {}
        return {m["leaf"]: a for a, m in models.items() if isinstance(m, dict) and m.get("leaf")}

    @property
    def running(self) -> Plan:
        """The plan of a state its reader checked has one (api/operate.governed refuses a
        state without a plan before a tune or rollback reads it)."""
        if self.plan is None:
            raise ValueError(f"the state of {self.policy} has no plan")
        return self.plan

    def to_json(self) -> dict[str, Any]:
        """The state file's object (without ``format``, which Publisher adds)."""
        out: dict[str, Any] = {}
        for key in _KEYS[self.source]:
            value = getattr(self, key)
            if value is None and key in _WHEN_SET and self.source != "launch":
                continue  # carried over from `governor apply`'s state only when it had it
            if value is None and key in (_NEVER_NONE | _ONLY_SET):
                continue  # a state read back that lacked it (a writer always sets it)
            if key == "plan" and isinstance(value, Plan):
                value = value.to_dict()
            out[key] = round(value, 3) if key == "started_at" else value
        return out


# the keys each source writes, in its order (docs/status.schema.json documents what status
# makes of them)
_KEYS = {
    "launch": (
        "policy", "source", "policy_path", "policy_sha256", "pid", "engine_pid", "started_at",
        "backend", "cgroup_root", "group", "leaf", "restarts", "model_bytes", "rules",
        "last_actions", "action_totals", "model", "prefetch_files", "plan", "systemd", "ready",
        "board", "qos", "shed_totals", "router", "pid_start", "kept_by",
    ),
    "monitor": (
        "policy", "source", "policy_path", "policy_sha256", "pid", "started_at", "backend",
        "cgroup_root", "group", "leaf", "restarts", "plan", "created", "systemd", "engine_pid",
        "rules", "last_actions", "action_totals", "qos", "shed_totals", "router", "pid_start",
    ),
    "apply": (
        "policy", "source", "policy_path", "pid", "started_at", "backend", "cgroup_root",
        "group", "leaf", "plan", "created", "kept_by", "qos",
    ),
}  # fmt: skip
_WHEN_SET = frozenset({"created", "systemd", "kept_by"})
_REQUIRED = _KEYS["apply"][:10]  # what every writer sets (the fields without a default)
_NEVER_NONE = frozenset({"started_at", "cgroup_root", "group", "leaf", "plan"})
# written only when set: a launch's kept_by ("launch --keep": its group and claim outlive the
# run), the publisher's start time
_ONLY_SET = frozenset({"kept_by", "pid_start"})


# ------------------------------------------------------------------ the one validating reader
# Another process wrote the file (or a crash, a full disk, a hand): every value a reader uses is
# checked here, once, so that status, top, metrics, tune, rollback, prune and a running shedder
# see a typed RunState or a clear error for THAT file, never a traceback, never a blind spot
# for the other slices.


def _is_int(v: Any) -> bool:
    return type(v) is int


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _has(**keys: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A dict whose ``keys`` (when present) pass their check."""
    return lambda v: (
        isinstance(v, dict) and all(k not in v or check(v[k]) for k, check in keys.items())
    )


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _pid(v: Any) -> bool:
    return _is_int(v) and v > 0


_RULE = _has(
    rule=_is_int, when=_str, state=_str, fired=_is_int, next_actions=_list_of(_str),
    since=_opt(is_number), last_fired=_opt(is_number), hold_until=_opt(is_number),
    cooldown_until=_opt(is_number),
)  # fmt: skip
_FIRING = _has(rule=_is_int, when=_str, at=_opt(is_number), actions=_list_of(_has(action=_str)))
_TYPES: dict[str, Callable[[Any], bool]] = {
    "policy": lambda v: isinstance(v, str) and bool(v) and "/" not in v and v not in (".", ".."),
    "source": lambda v: isinstance(v, str) and v in _KEYS,
    "policy_path": _opt(_str),
    "pid": _opt(_pid),
    "pid_start": _opt(lambda v: _is_int(v) and v >= 0),
    "started_at": is_number,
    "backend": _opt(_str),
    "cgroup_root": _str,
    "group": _str,
    "leaf": _str,
    "plan": lambda v: isinstance(v, dict),
    "policy_sha256": _opt(_str),
    "engine_pid": _opt(_pid),
    "restarts": lambda v: _is_int(v) and v >= 0,
    "model_bytes": _opt(_is_int),
    "rules": _list_of(_RULE),
    "last_actions": _list_of(_FIRING),
    "action_totals": _list_of(_has(rule=_is_int, action=_str, count=_is_int)),
    "model": _opt(lambda v: isinstance(v, dict)),
    "prefetch_files": _list_of(_str),
    "systemd": _opt(_has(unit=_str)),
    "created": _opt(_list_of(_str)),
    "kept_by": _opt(_str),
    "ready": _opt(lambda v: isinstance(v, bool)),
    "board": _opt(lambda v: isinstance(v, dict) and all(_is_int(x) for x in v.values())),
    "qos": _opt(_has(**{"class": _str, "yield": _list_of(_str)})),
    "shed_totals": _list_of(_has(victim=_str, step=_str, count=_is_int)),
    "router": _opt(
        lambda v: (
            isinstance(v, dict)
            and _str(v.get("url"))
            and isinstance(v.get("models", {}), dict)
            and all(
                isinstance(m, dict)
                and _opt(is_number)(m.get("last_request"))
                and _opt(is_leaf)(m.get("leaf"))
                and _opt(is_number)(m.get("load_s"))
                and _opt(_is_int)(m.get("bytes"))
                for m in v.get("models", {}).values()
            )
            and _list_of(_has(model=_str, reason=_str, count=_is_int))(v.get("unloads", []))
        )
    ),
}


class StateError(ValueError):
    """One state file that is not a state: ``path`` and what is wrong with it."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def check_state(data: Any, name: str | None = None) -> str | None:
    """None when ``data`` is a state as the governor writes it (published under ``name``);
    else what is wrong with it. The plan must be one this version reads."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if "policy" not in data:  # a key it lacks otherwise has its default (RunState.read)
        return "no 'policy'"
    for key, check in _TYPES.items():
        if key in data and not check(data[key]):
            return f"{key} {str(data[key])[:60]!r} is not what a governor writes"
    if name is not None and data["policy"] != name:
        return f"policy {data['policy']!r} published under {name!r}"
    try:
        if "plan" in data:  # a reader that needs one skips a state without it
            check_types(Plan.from_dict(data["plan"]))
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        return f"plan: not a plan this governor reads ({type(err).__name__}: {str(err)[:60]})"
    return None


def load_state(path: Path) -> RunState:
    """THE reader of one state.json: its record, checked (:func:`check_state`); StateError
    (one line, this file) when it cannot be read or is not a state: a FIFO, a device, a
    symlink (a governor writes a file: not followed) or more than ``STATE_MAX`` bytes are
    refused before reading any of it (governor/peer/files.py). FileNotFoundError passes."""
    try:
        raw = read_capped(path, STATE_MAX, follow=False)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise StateError(path, f"cannot read it ({err.strerror})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise StateError(path, "not UTF-8") from None
    except ValueError as err:
        raise StateError(path, f"not JSON ({err})") from None
    name = path.parent.name
    problem = _CHECKED.get(name, raw, lambda: check_state(data, name))
    if problem is not None:
        raise StateError(path, problem)
    return RunState.read(data)


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

    def read(self) -> RunState | None:
        """What is published under this name now (by anyone), None when nothing readable is
        (no file, or one that is not a state: :func:`load_state`)."""
        try:
            return load_state(self.path)
        except (OSError, StateError):
            return None

    def publish(self, state: RunState | Mapping[str, Any]) -> bool:
        """Atomically replace the state file; False (never raises) when it cannot be written:
        publishing must not stop the engine. A mapping is written as it is."""
        with self._lock:
            return self._publish(state.to_json() if isinstance(state, RunState) else state)

    def _publish(self, state: Mapping[str, Any]) -> bool:
        data = json.dumps({"format": FORMAT, **state}, default=str).encode()
        try:
            self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            write_atomic(self.path, data, 0o644)
        except OSError:
            return False
        return True

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self.dir.rmdir()  # only when nothing else lives there (a journal stays)


def applied(
    plan: Plan,
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
        policy=plan.policy,
        source="apply",
        policy_path=policy_path,
        pid=None,
        started_at=started_at,
        backend="cgroupfs",
        cgroup_root=plan.cgroup_root,
        group=plan.group,
        leaf=plan.leaf,
        plan=plan,
        created=created,
        kept_by=kept_by,
        qos=qos_of(plan),
    )


def qos_of(plan: Plan) -> dict[str, Any]:
    """The plan's [qos] as the policy spells it, as a state publishes it."""
    return {"class": plan.qos.qos_class, "yield": list(plan.qos.yields)}


def is_stale(state: RunState, proc: Path = Path("/proc")) -> bool:
    """A state nothing holds any more: its publisher is gone (:func:`alive`); an `apply`
    state (no process) once its cgroup is gone."""
    if state.source == "apply":
        plan = state.plan
        root = state.cgroup_root or (plan.cgroup_root if plan is not None else None)
        group = state.group or (plan.group if plan is not None else None)
        if not isinstance(root, str) or not isinstance(group, str):
            return False  # no cgroup to look for: a reader that needs one skips the state
        try:
            return not CgroupFs(Path(root)).exists(group)
        except ValueError:  # not a clean relative path: no group of ours to look for
            return False
    return not alive(state.pid, proc, start=state.pid_start)


def scan_states(
    directory: Path, proc: Path = Path("/proc")
) -> tuple[list[RunState], list[StateError]]:
    """Every published state (:func:`load_state`), with ``stale`` set (:func:`is_stale`: its
    publisher is gone, or for `apply`'s, which have no process, its cgroup); and one StateError
    per state file that is not a state (the others are read all the same)."""
    out: list[RunState] = []
    errors: list[StateError] = []
    try:
        names = sorted(p.name for p in directory.iterdir() if p.is_dir())
    except OSError:
        return out, errors
    for name in names:
        try:
            state = load_state(directory / name / STATE_FILE)
        except FileNotFoundError:
            continue  # a journal's directory, or a run that just ended
        except StateError as err:
            errors.append(err)
            continue
        out.append(replace(state, stale=is_stale(state, proc)))
    return out, errors


def read_states(directory: Path, proc: Path = Path("/proc")) -> list[RunState]:
    """:func:`scan_states`' states (a file that is not a state is skipped)."""
    return scan_states(directory, proc)[0]


def prune_stale(
    directory: Path, name: str | None = None, proc: Path = Path("/proc")
) -> list[tuple[str, Any]]:
    """Remove the published state of every stale entry (NAME's only, when given): (name, pid)
    of each removed. A journal in the same directory stays (tune history, rollback)."""
    pruned: list[tuple[str, Any]] = []
    for state in read_states(directory, proc):
        if not state.stale or name not in (None, state.policy):
            continue
        publisher = Publisher(directory, state.policy)
        again = publisher.read()  # a new run may have published since
        if again is None or again.pid != state.pid:
            continue
        publisher.remove()
        pruned.append((state.policy, state.pid))
    return pruned


def states_of(directory: Path, name: str | None, *, hint: str) -> list[RunState]:
    """:func:`read_states`, only NAME's when given: PolicyNotFound (66) when it has none (its
    file's problem when it has one that is not a state)."""
    states, errors = scan_states(directory)
    if name is not None:
        states = [s for s in states if s.policy == name]
        if not states:
            bad = next((e for e in errors if e.path.parent.name == name), None)
            if bad is not None:
                raise PolicyNotFound(
                    f"the state of {name} is not readable: {bad.problem} ({bad.path})",
                    hint="its supervisor (if any) rewrites it at its next change; else move"
                    " the file away",
                )
            raise PolicyNotFound(f"no governed slice named {name} ({directory})", hint=hint)
    return states
