"""Read policy files: TOML via tomllib, ``extends`` chains, errors with file and field path.

Override rules for ``extends = "base.toml"`` (path relative to the extending file):
tables merge key by key, recursively; scalars and arrays (``[[pressure]]``, ``prefetch.files``)
in the extending file replace the parent's entirely; ``name`` is never inherited (each file
names itself); ``description`` is inherited unless given. Cycles are an error.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from governor.errors import PermissionDenied, PolicyError, PolicyNotFound
from governor.errors import shown as _shown
from governor.policy.model import Policy

MAX_EXTENDS_DEPTH = 8
V1_KNOB = "oom_kill_disable"
V1_HINT = (
    "memory.oom_kill_disable exists only in cgroup v1; in v2 use memory.oom_group = false"
    " (memory.oom.group), process.oom_score_adj = -1000 for a process that must survive,"
    " and memory.min to protect the model's memory"
)

Raw = dict[str, Any]
MAX_POLICY_BYTES = 1 << 20  # a policy is a few KiB; 100 MB took 16 s and 240 MB of RSS
MAX_NESTING = 8  # [[pressure]] tables sit at 2; 2000 dotted levels blew the recursion limit
Provenance = dict[tuple[str, ...], str]


def load(
    path: str | Path,
    *,
    euid: int | None = None,
    overrides: Mapping[tuple[str, str], object] | None = None,
    overrides_source: str = "command line",
) -> Policy:
    """Load and validate a policy file (and what it extends); ``overrides`` set
    ``[section] key = value`` on top (`governor tune`), validated by the same rules and named
    ``overrides_source`` in errors."""
    raw, prov = _load_chain(Path(path), euid=os.geteuid() if euid is None else euid, stack=())
    for (section, key), value in (overrides or {}).items():
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise PolicyError(f"{section} is not a table", file=str(path), field=section)
        table[key] = value
        prov[(section, key)] = overrides_source
    _reject_v1_knob(raw, prov, ())
    try:
        return Policy.model_validate(raw)
    except ValidationError as err:
        raise _translate(err, prov, str(path)) from err


def load_text(text: str, *, source: str = "<string>") -> Policy:
    """Validate a policy given as TOML text (no ``extends``); for tests and `tune`."""
    raw = _parse_toml(text, source)
    if "extends" in raw:
        raise PolicyError("extends is not supported here", file=source, field="extends")
    prov: Provenance = {(): source}
    _reject_v1_knob(raw, prov, ())
    try:
        return Policy.model_validate(raw)
    except ValidationError as err:
        raise _translate(err, prov, source) from err


def _load_chain(path: Path, *, euid: int, stack: tuple[Path, ...]) -> tuple[Raw, Provenance]:
    text = _read(path, euid=euid)
    raw = _parse_toml(text, str(path))
    prov: Provenance = {(): str(path)}
    _record(raw, prov, (), str(path))
    parent_ref = raw.pop("extends", None)
    if parent_ref is None:
        return raw, prov
    if not isinstance(parent_ref, str):
        raise PolicyError("extends must be a string path", file=str(path), field="extends")
    try:
        parent = (path.parent / parent_ref).resolve()
        chain = (*stack, path.resolve())
        parent_exists = parent.exists()
    except (OSError, RuntimeError, ValueError) as err:  # symlink loop, NUL, ENAMETOOLONG
        reason = getattr(err, "strerror", None) or str(err)
        raise PolicyError(
            f"cannot resolve extends path: {reason}",
            file=str(path),
            field="extends",
            hint='extends names a policy file relative to this one, e.g. "base.toml"',
        ) from None
    if parent in chain:
        cycle = " -> ".join(str(p) for p in (*chain, parent))
        raise PolicyError(f"extends cycle: {cycle}", file=str(path), field="extends")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise PolicyError(
            f"extends chain deeper than {MAX_EXTENDS_DEPTH}", file=str(path), field="extends"
        )
    if not parent_exists:
        raise PolicyNotFound(
            f"extended policy {parent_ref!r} not found", file=str(path), field="extends"
        )
    base, base_prov = _load_chain(parent, euid=euid, stack=chain)
    base.pop("name", None)
    base_prov.pop(("name",), None)  # never inherited: a missing name is the child's fault
    merged = _merge(base, raw)
    base_prov.update(prov)
    return merged, base_prov


def _read(path: Path, *, euid: int) -> str:
    try:
        st = path.stat()
    except FileNotFoundError as err:
        raise PolicyNotFound(
            "policy file not found", file=str(path), hint="give the path to a .toml policy"
        ) from err
    except OSError as err:
        raise PolicyError(
            f"cannot stat policy: {err.strerror}", file=str(path), hint="give a .toml file"
        ) from err
    except ValueError as err:  # a NUL in the path
        raise PolicyError(f"invalid policy path: {err}", file=repr(str(path))[1:-1]) from err
    if st.st_size > MAX_POLICY_BYTES:
        raise PolicyError(
            f"policy file is larger than {MAX_POLICY_BYTES >> 10} KiB ({st.st_size} bytes)",
            file=str(path),
            hint="a policy is a few dozen lines; is this the right file?",
        )
    if stat.S_ISDIR(st.st_mode):
        raise PolicyNotFound(
            "policy path is a directory", file=str(path), hint="give the path to a .toml file"
        )
    if not stat.S_ISREG(st.st_mode):  # /dev/zero or a FIFO would hang or eat memory
        raise PolicyError(
            "policy path is not a regular file", file=str(path), hint="give a .toml file"
        )
    if euid == 0 and st.st_mode & stat.S_IWOTH:
        raise PermissionDenied(
            "refusing a policy file writable by others while running as root",
            file=str(path),
            hint=f"chmod o-w {path}",
        )
    try:
        data = path.read_bytes()
    except PermissionError as err:
        raise PermissionDenied("cannot read policy file", file=str(path), errno=err.errno) from err
    except OSError as err:
        raise PolicyError(f"cannot read policy: {err.strerror}", file=str(path)) from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PolicyError(f"policy is not valid UTF-8 (byte {err.start})", file=str(path)) from err


def _parse_toml(text: str, source: str) -> Raw:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise PolicyError(
            f"TOML syntax error: {err}", file=source, hint="see policies/*.toml for the syntax"
        ) from err
    except RecursionError as err:  # tomllib recurses per nesting level
        raise PolicyError("TOML nested too deeply", file=source) from err
    if _depth(raw) > MAX_NESTING:
        raise PolicyError(
            f"keys nested deeper than {MAX_NESTING} levels",
            file=source,
            hint="a policy has [section] key = value, and [[pressure]] tables",
        )
    return raw


def _depth(raw: object) -> int:
    """How deep tables and arrays nest (iteratively: no recursion limit to hit)."""
    deepest, todo = 0, [(raw, 0)]
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        if level > MAX_NESTING:
            break
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        )
        todo.extend((child, level + 1) for child in children)
    return deepest


def _record(raw: Raw, prov: Provenance, prefix: tuple[str, ...], source: str) -> None:
    for key, value in raw.items():
        path = (*prefix, key)
        prov[path] = source
        if isinstance(value, dict):
            _record(value, prov, path, source)


def _merge(base: Raw, over: Raw) -> Raw:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _reject_v1_knob(raw: object, prov: Provenance, path: tuple[str, ...]) -> None:
    if isinstance(raw, dict):
        for key, value in raw.items():
            here = (*path, str(key))
            if key == V1_KNOB:
                raise PolicyError(
                    "oom_kill_disable is a cgroup v1 knob and does not exist in cgroup v2",
                    file=_source_of(prov, here),
                    field=".".join(here),
                    hint=V1_HINT,
                )
            _reject_v1_knob(value, prov, here)
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            _reject_v1_knob(item, prov, (*path, f"[{i}]"))


def _source_of(prov: Provenance, path: tuple[str, ...]) -> str:
    for n in range(len(path), -1, -1):
        if path[:n] in prov:
            return prov[path[:n]]
    return prov.get((), "<policy>")


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def _translate(err: ValidationError, prov: Provenance, default_source: str) -> PolicyError:
    errors = err.errors(include_url=False)
    # a bad item also fails its container's constraints (e.g. a list "too short" once the item
    # is dropped): report distinct problems, not follow-on errors at a parent location
    locs = [tuple(e["loc"]) for e in errors]
    errors = [
        e
        for e in errors
        if not any(o != tuple(e["loc"]) and o[: len(e["loc"])] == tuple(e["loc"]) for o in locs)
    ] or errors
    first = errors[0]
    # policy keys never contain '-' or '['; pydantic's validator/union labels always do
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and ("-" in p or "[" in p)))
    field = _field_path(loc) or None
    str_path = tuple(p for p in loc if isinstance(p, str))
    msg = _message(first)
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    hint = None
    if first["type"] == "extra_forbidden":
        hint = "check the spelling; `governor schema` lists every key"
    return PolicyError(
        msg, file=_source_of(prov, str_path) or default_source, field=field, hint=hint
    )


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "value_error":
        return str(error["ctx"]["error"]) if "ctx" in error else error["msg"]
    if kind == "bool_type":
        return f"expected true or false, got {_shown(error['input'])}"
    if kind in ("int_type", "int_parsing"):
        return f"expected an integer, got {_shown(error['input'])}"
    if kind == "string_type":
        return f"expected a string, got {_shown(error['input'])}"
    if kind == "missing":
        return "required key missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a table, got {_shown(error['input'])}"
    if kind == "too_short":
        return f"needs at least {error.get('ctx', {}).get('min_length', 1)} item(s), got none"
    if kind == "too_long":
        return f"has more than {error.get('ctx', {}).get('max_length', '?')} items"
    if kind in ("tuple_type", "list_type"):
        return f"expected a list, got {_shown(error['input'])}"
    msg = str(error["msg"])
    if "input" in error and not isinstance(error["input"], dict | list):
        msg += f", got {_shown(error['input'])}"
    return msg
