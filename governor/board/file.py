"""The board file (issue 23): cgroups no policy governs (a camera recorder's service, a
container) that a `shed` may take memory from, each with its QoS class.

``/etc/governor/board.toml`` (``$GOVERNOR_BOARD`` overrides the path)::

    [[cgroup]]
    path = "system.slice/camera.service"   # relative to the cgroup2 root
    class = "background"                   # interactive | standard | background
    yield = ["throttle", "freeze"]         # the shed steps it allows (default: all four)
    name = "camera"                        # journal, status and metrics name (default: the
                                           # path's last component)

    [board]
    reserve = "384MiB"   # kept for the OS and ungoverned services (issue 36): the budget is
                         # MemTotal less this (default: 128 MiB + MemTotal/16, at most 1 GiB)

Checked like a policy (``governor check /etc/governor/board.toml``): any problem is a
PolicyError (65) naming the file and the field. Standard library only: the run time (the
shedding monitor) reads it too. A missing file means no ungoverned cgroups.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from governor.errors import PolicyError
from governor.errors import shown as _shown
from governor.peer.files import read_capped
from governor.plan.model import CGROUP_STEPS, QOS_RANK
from governor.record import record
from governor.sizes import BINARY

RESERVE_LIMIT = 64 << 30  # a reserve this large is a typo, not a board

BOARD_FILE = Path("/etc/governor/board.toml")
BOARD_ENV = "GOVERNOR_BOARD"
# the policies' default slice (governor/policy/model.py): everything in it is governed, and a
# board entry may not be, contain or lie inside it (nor any other policy's group)
GOVERNED_ROOT = "governor.slice"
BOARD_HINT = "see docs/several.md, 'The board file', for the board file's keys"
MAX_BOARD_BYTES = 1 << 20
NAME_MAX = 255  # a cgroup is a directory: each path component is a file name (limits.h)
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_PATH_RE = re.compile(r"^[A-Za-z0-9@:_.\\-]+(/[A-Za-z0-9@:_.\\-]+)*$")
_KEYS = ("path", "class", "yield", "name")
_BOARD_KEYS = ("reserve",)
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(|B|K|KiB|M|MiB|G|GiB|T|TiB)$")


@record(frozen=True)
class BoardCgroup:
    name: str
    path: str  # relative to the cgroup2 root
    qos_class: str
    yields: tuple[str, ...]  # in ladder order


@record(frozen=True)
class BoardRead:
    """What the board file holds: its valid entries and one error per entry that is not (or
    one for the whole file: unreadable, not TOML)."""

    entries: tuple[BoardCgroup, ...] = ()
    errors: tuple[PolicyError, ...] = ()
    reserve: int | None = None  # [board] reserve, bytes (None: the default, board/budget.py)


def board_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env[BOARD_ENV]) if env.get(BOARD_ENV) else BOARD_FILE


def is_board_file(path: Path) -> bool:
    """A TOML file with ``[[cgroup]]`` tables and no policy ``name``: `governor check` checks
    it as the board file."""
    import tomllib  # the run time loads this module with every shed rule's monitor: TOML only on a read

    try:
        raw = tomllib.loads(read_capped(path, MAX_BOARD_BYTES).decode())
    except (OSError, ValueError, RecursionError):  # the policy loader says what is wrong
        return False
    return ("cgroup" in raw or "board" in raw) and "name" not in raw


def read_board(path: Path | None = None, governed: Collection[str] = ()) -> BoardRead:
    """The board file through its one validating reader: every valid entry, and a PolicyError
    for each entry (or for the whole file) that is not; a bad entry never hides the others.
    ``governed``: the governed slices' groups a board entry may not be, contain or lie inside
    (``GOVERNED_ROOT`` always). No file: no entries, no error."""
    path = board_path() if path is None else path
    try:  # a FIFO, a device or a file over 1 MiB is refused before any of it is read
        data = read_capped(path, MAX_BOARD_BYTES)
    except FileNotFoundError:
        return BoardRead()
    except OSError as err:
        return _whole(f"cannot read the board file: {err.strerror}", path)
    import tomllib  # (tomllib pulls datetime and string: ~2 ms and 0.3 MiB the supervisor keeps)

    try:
        raw = tomllib.loads(data.decode())
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        return _whole(f"TOML syntax error: {err}", path)
    return parse_board(raw, str(path), governed)


RESERVE_HINT = (
    "[board] reserve is the memory kept for the OS and the ungoverned services: set it below"
    " MemTotal, or leave it out for the default (128 MiB + MemTotal/16, at most 1 GiB)"
)


def no_budget_error(text: str, path: Path) -> PolicyError:
    """The error of a reserve that leaves no budget (board/budget.py no_budget_text's ``text``):
    `check BOARD`, admission and `init` refuse with it (65), naming the reserve and the file."""
    return PolicyError(f"{text} ([board] reserve, {path})", hint=RESERVE_HINT)


def load_board(path: Path | None = None, governed: Collection[str] = ()) -> tuple[BoardCgroup, ...]:
    """The board's ungoverned cgroups, all valid, for `governor check`: () when the file does
    not exist; the first entry's error as a PolicyError (65) otherwise."""
    read = read_board(path, governed)
    if read.errors:
        raise read.errors[0]
    return read.entries


def _whole(msg: str, path: Path) -> BoardRead:
    return BoardRead(errors=(PolicyError(msg, file=str(path), hint=BOARD_HINT),))


def parse_board(raw: dict[str, Any], source: str, governed: Collection[str] = ()) -> BoardRead:
    def fail(msg: str, field: str, hint: str = BOARD_HINT) -> PolicyError:
        return PolicyError(msg, file=source, field=field, hint=hint)

    errors = [fail("unknown key", key) for key in raw if key not in ("cgroup", "board")]
    reserve = None
    board = raw.get("board", {})
    if not isinstance(board, dict):
        errors.append(fail(f"expected a [board] table, got {_shown(board)}", "board"))
    else:  # an unknown key is told, and hides no reserve
        errors += [fail("unknown key", f"board.{key}") for key in board if key not in _BOARD_KEYS]
        try:
            reserve = _reserve(board.get("reserve"), fail)
        except PolicyError as err:
            errors.append(err)
    tables = raw.get("cgroup", [])
    if not isinstance(tables, list):
        return BoardRead(
            errors=(*errors, fail("expected [[cgroup]] tables", "cgroup")), reserve=reserve
        )
    slices = (GOVERNED_ROOT, *governed)
    out: list[BoardCgroup] = []
    for i, t in enumerate(tables):
        try:
            entry = _entry(t, f"cgroup[{i}]", fail, slices)
            if any(c.name == entry.name for c in out):
                raise fail(f"name {entry.name!r} is given twice", f"cgroup[{i}].name")
        except PolicyError as err:
            errors.append(err)
            continue
        out.append(entry)
    return BoardRead(entries=tuple(out), errors=tuple(errors), reserve=reserve)


def _reserve(value: object, fail: Callable[..., PolicyError]) -> int | None:
    """``[board] reserve``: bytes (an integer) or a size ("384MiB", "1G"), below 64 GiB."""
    if value is None:
        return None
    size: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := _SIZE_RE.fullmatch(value.strip())):
        size = int(float(m.group(1)) * BINARY[m.group(2)])
    if size is None or not 0 <= size < RESERVE_LIMIT:
        raise fail(
            f'expected a size below 64GiB (bytes, or like "384MiB"), got {_shown(value)}',
            "board.reserve",
            hint="the memory kept for the OS and ungoverned services; leave it out for the"
            " default (128 MiB + MemTotal/16, at most 1 GiB)",
        )
    return size


def _entry(
    t: object, where: str, fail: Callable[..., PolicyError], governed: Sequence[str]
) -> BoardCgroup:
    """One ``[[cgroup]]`` table as a typed record, or its PolicyError."""
    if not isinstance(t, dict):
        raise fail(f"expected a [[cgroup]] table, got {_shown(t)}", where)
    for key in t:
        if key not in _KEYS:
            raise fail("unknown key", f"{where}.{key}")
    path = t.get("path")
    if not isinstance(path, str) or not path:
        raise fail(f"expected a cgroup path, got {_shown(path)}", f"{where}.path")
    parts = path.split("/")
    if (
        path.startswith("/")
        or {".", ".."} & set(parts)
        or not _PATH_RE.fullmatch(path)
        or any(len(p.encode()) > NAME_MAX for p in parts)
    ):
        raise fail(
            f"invalid cgroup path {_shown(path)}: relative to the cgroup2 root, no '.' or '..'"
            f" component, no spaces, at most {NAME_MAX} bytes a component",
            f"{where}.path",
        )
    for g in governed:
        if path == g or g.startswith(path + "/") or path.startswith(g + "/"):
            raise fail(
                f"cgroup path {path!r} is, contains or lies inside the governed slice {g!r}:"
                " its own policy's [qos] class and yield decide what a shed does to it",
                f"{where}.path",
                hint="remove the entry, or name a cgroup outside every governed slice",
            )
    cls = t.get("class", "standard")
    if not isinstance(cls, str) or cls not in QOS_RANK:
        raise fail(
            f"expected 'interactive', 'standard' or 'background', got {_shown(cls)}",
            f"{where}.class",
        )
    steps = t.get("yield", list(CGROUP_STEPS))
    if not isinstance(steps, list) or any(s not in CGROUP_STEPS for s in steps):
        raise fail(
            f"expected a list of {', '.join(CGROUP_STEPS)}, got {_shown(steps)}", f"{where}.yield"
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
    return BoardCgroup(
        name=name, path=path, qos_class=cls, yields=tuple(s for s in CGROUP_STEPS if s in steps)
    )
