"""The board file (issue 23): cgroups no policy governs (a camera recorder's service, a
container) that a `shed` may take memory from, each with its QoS class.

``/etc/governor/board.toml`` (``$GOVERNOR_BOARD`` overrides the path)::

    [[cgroup]]
    path = "system.slice/camera.service"   # relative to the cgroup2 root
    class = "background"                   # interactive | standard | background
    yield = ["throttle", "freeze"]         # the shed steps it allows (default: all four)
    name = "camera"                        # journal, status and metrics name (default: the
                                           # path's last component)

Checked like a policy (``governor check /etc/governor/board.toml``): any problem is a
PolicyError (65) naming the file and the field. Standard library only: the run time (the
shedding monitor) reads it too. A missing file means no ungoverned cgroups.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from governor.errors import PolicyError
from governor.errors import shown as _shown
from governor.plan.model import QOS_RANK, SHED_STEPS
from governor.record import record

BOARD_FILE = Path("/etc/governor/board.toml")
BOARD_ENV = "GOVERNOR_BOARD"
BOARD_HINT = "see docs/several.md, 'The board file', for the board file's keys"
MAX_BOARD_BYTES = 1 << 20
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_PATH_RE = re.compile(r"^[A-Za-z0-9@:_.\\-]+(/[A-Za-z0-9@:_.\\-]+)*$")
_KEYS = ("path", "class", "yield", "name")


@record(frozen=True)
class BoardCgroup:
    name: str
    path: str  # relative to the cgroup2 root
    qos_class: str
    yields: tuple[str, ...]  # in ladder order


def board_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env[BOARD_ENV]) if env.get(BOARD_ENV) else BOARD_FILE


def is_board_file(path: Path) -> bool:
    """A TOML file with ``[[cgroup]]`` tables and no policy ``name``: `governor check` checks
    it as the board file."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # the policy loader says what is wrong
        return False
    return "cgroup" in raw and "name" not in raw


def load_board(path: Path | None = None) -> tuple[BoardCgroup, ...]:
    """The board's ungoverned cgroups; () when the file does not exist. PolicyError (65)."""
    path = board_path() if path is None else path
    try:
        data = path.read_bytes()[: MAX_BOARD_BYTES + 1]
    except FileNotFoundError:
        return ()
    except OSError as err:
        raise PolicyError(f"cannot read the board file: {err.strerror}", file=str(path)) from err
    if len(data) > MAX_BOARD_BYTES:
        raise PolicyError("the board file is larger than 1 MiB", file=str(path))
    try:
        raw = tomllib.loads(data.decode())
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise PolicyError(f"TOML syntax error: {err}", file=str(path), hint=BOARD_HINT) from err
    return parse_board(raw, str(path))


def parse_board(raw: dict[str, Any], source: str) -> tuple[BoardCgroup, ...]:
    def fail(msg: str, field: str) -> PolicyError:
        return PolicyError(msg, file=source, field=field, hint=BOARD_HINT)

    for key in raw:
        if key != "cgroup":
            raise fail("unknown key", key)
    tables = raw.get("cgroup", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise fail("expected [[cgroup]] tables", "cgroup")
    out: list[BoardCgroup] = []
    for i, t in enumerate(tables):
        where = f"cgroup[{i}]"
        for key in t:
            if key not in _KEYS:
                raise fail("unknown key", f"{where}.{key}")
        path = t.get("path")
        if not isinstance(path, str) or not path:
            raise fail(f"expected a cgroup path, got {_shown(path)}", f"{where}.path")
        if path.startswith("/") or ".." in path.split("/") or not _PATH_RE.fullmatch(path):
            raise fail(
                f"invalid cgroup path {_shown(path)}: relative to the cgroup2 root, no '..',"
                " no spaces",
                f"{where}.path",
            )
        cls = t.get("class", "standard")
        if cls not in QOS_RANK:
            raise fail(
                f"expected 'interactive', 'standard' or 'background', got {_shown(cls)}",
                f"{where}.class",
            )
        steps = t.get("yield", list(SHED_STEPS))
        if not isinstance(steps, list) or any(s not in SHED_STEPS for s in steps):
            raise fail(
                f"expected a list of {', '.join(SHED_STEPS)}, got {_shown(steps)}",
                f"{where}.yield",
            )
        if len(set(steps)) != len(steps):
            raise fail(f"a step is listed twice in {steps}", f"{where}.yield")
        stem = path.rsplit("/", 1)[-1].removesuffix(".service").lower()
        name = t.get("name", re.sub(r"[^a-z0-9_-]", "-", stem)[:63])
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise fail(
                f"invalid name {_shown(name)}: lower-case letters, digits, '_' and '-'",
                f"{where}.name",
            )
        if any(c.name == name for c in out):
            raise fail(f"name {name!r} is given twice", f"{where}.name")
        out.append(
            BoardCgroup(
                name=name,
                path=path,
                qos_class=cls,
                yields=tuple(s for s in SHED_STEPS if s in steps),
            )
        )
    return tuple(out)
