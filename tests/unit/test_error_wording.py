"""Every error the governor raises reads `governor: <what> (<where>)`, and the where MEANS
something. Checked on the source (AST), so a new raise site cannot forget it.

What counts as a where (at least one item of the final "(...)", items split on , and ;):
- a file: an absolute path (`/proc/1/comm`, `{root}/proc/meminfo`) or an interpolation of one
  (`{path}`, `{run_dir() / name}`, `{self.unit}`, `{str(path)}`: a variable, attribute or call
  whose NAME ends in a path, file, dir, root, cgroup, group, unit, job, source, option or
  where word, or a `/` join; `{profile}`, `{len(files)}` or `{x.file_count}` are none);
- a policy field: `engine.max_context_tokens`, `memory.max`, `qos.class`, `clocks.big.max`
  (every table of the policy, read from the model);
- a cgroup or a systemd unit: `{cgroup}`, `{unit}`, `x.slice`, `y.service`;
- a process: `pid 1`, `pid {pid}`;
- a CLI option or argument: `--engine-argv`, `-c/--ctx-size`, `{option}`, the engine command
  after `-- ENGINE`, a metavar like `POLICY` or `KEY=VALUE`.
A fixed generic literal (`(command line)`, `(systemd manager)`), an errno name (`(ENOENT)`)
and a coordinate keyword given as None (`file=None`) are none of these.

Errors whose coordinates are keyword fields (PolicyError file/field, the OS failures'
cgroup/file, EngineArgvError's option) get the parenthesis from the class; a constant value
given there must itself be a where. An EngineArgvError's reason must not end in "(...)": its
option is appended, and preflight/estimate put theirs in the same parenthesis, never
`(...) (...)`. errno is no where: it says what failed, not where. The few messages that carry
their coordinates inline are on ALLOW, one per site.

Needs: nothing (reads governor/**/*.py)."""

from __future__ import annotations

import ast
import errno
import re
from pathlib import Path

from governor.policy.model import Policy

PACKAGE = Path(__file__).resolve().parents[2] / "governor"
# every subclass of these (found in the source) is checked too; EngineArgvError is a
# ValueError whose text reaches the user (`governor estimate --engine-argv "-c abc"`)
ROOTS = {"GovernorError", "EngineArgvError"}
FIELDS = {
    "PolicyError": {"file", "field"},
    "_OsFailure": {"cgroup", "file"},
    "EngineArgvError": {"option"},
    "HttpError": {"url"},  # the peer's URL (governor/peer/http.py)
}
# constant keyword values that name their place without being a path/field/option
KEYWORD_WORDS = {
    # the engine's own argv, as preflight sees it: the command after `--` for launch/install,
    # --engine-argv for check; preflight is shared and always pairs it with the option/field
    "engine argv",
}
# (file, start of the message): messages whose coordinates are inline, each justified
ALLOW = {
    # _bus_error: the action names the unit or job ("cannot start transient unit {name}",
    # "no unit {unit}", "cannot read job {job}"); the bus's own message follows it
    ("backends/systemd.py", "{action}: "),  # the template shows {expression}
    # a missing Python package: there is no file or field; the hint says what installs it
    ("backends/systemd.py", "the systemd backend needs pystemd"),
    ("engines/gguf.py", "reading GGUF headers needs the python package"),
    # the problems joined here each end with their own (file): "controller io is not
    # available (/sys/fs/cgroup/cgroup.controllers)"
    ("compile/available.py", "cannot enforce the policy on this host: "),
    # the address is inline ("at http://0.0.0.0:80/metrics"); the class appends the errno
    ("metrics/export.py", "cannot listen for metrics at "),
}

_OPTION = re.compile(r"(?<![\w/])--?[A-Za-z][\w-]*|(?<!\S)-- [A-Z]+")
_METAVAR = re.compile(r"[A-Z][A-Z_]*(=[A-Z]+)?")
_ERRNO_NAMES = frozenset(errno.errorcode.values())  # what failed, not where: (ENOENT) is no where
# the policy's top-level keys as a user writes them (`qos`, `clocks`...): read from the model, so
# a new table is a field at once
_KEYS = sorted(f.alias or name for name, f in Policy.model_fields.items())
_FIELD = re.compile(rf"\b({'|'.join(_KEYS)})(\.[a-z_]+)+")
_SECTION = re.compile("|".join(_KEYS))
_PATH = re.compile(r"(?:^|[\s:])/[\w.]|\{#\d+\}/")
_PID = re.compile(r"\bpid (\d+|\{#\d+\})")
_UNIT = re.compile(r"\.(service|slice|scope)\b")
# the last word of an interpolated name that makes it a place ("policy_path", "self.unit")
_PLACE_WORDS = frozenset(
    [
        "path",
        "file",
        "filename",
        "dir",
        "directory",
        "root",
        "cgroup",
        "group",
        "unit",
        "job",
        "source",
        "option",
        "where",
    ]
)
# calls that show their argument as it is: the argument decides (`{str(path)}`)
_SHOWING = frozenset({"str", "repr", "fspath", "shown", "join", "Path", "resolve", "name"})


def _named_place(name: str) -> bool:
    """Whether an identifier names a place: its last word (``_``-separated, a plural or a
    one-letter suffix as in ``option_a`` aside) is a place word."""
    words = [w for w in name.lower().split("_") if w]
    if len(words) > 1 and len(words[-1]) == 1:
        words.pop()  # option_a, option_b
    return bool(words) and (
        words[-1] in _PLACE_WORDS or words[-1].removesuffix("s") in _PLACE_WORDS
    )


def _expr_is_place(node: ast.expr) -> bool:
    """An interpolated expression that names a place (see the module docstring)."""
    if isinstance(node, ast.Name):
        return _named_place(node.id)
    if isinstance(node, ast.Attribute):
        return _named_place(node.attr)
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, ast.Div)  # a path joined in place: run_dir() / name
    if isinstance(node, ast.BoolOp):  # plan.source or "policy"
        return _expr_is_place(node.values[0])
    if isinstance(node, ast.Subscript):  # paths[0], entry["file"]
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return _named_place(key.value)
        return _expr_is_place(node.value)
    if isinstance(node, ast.Call):
        func = node.func
        fname = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if fname == "get" and node.args:  # prior.get("source")
            key = node.args[0]
            return isinstance(key, ast.Constant) and _named_place(str(key.value))
        if fname in _SHOWING:
            inner = list(node.args) or ([func.value] if isinstance(func, ast.Attribute) else [])
            return any(_expr_is_place(a) for a in inner)
        return _named_place(fname)  # run_dir(), proc.path("self", "cgroup")
    return False


def _template(node: ast.expr, exprs: list[str]) -> str:
    """The message's text with each interpolation as ``{#i}`` (its source in ``exprs[i]``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_template(v, exprs) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        node = node.value
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _template(node.left, exprs) + _template(node.right, exprs)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "strip"
        and not node.args
    ):  # f"...".strip()
        return _template(node.func.value, exprs)
    exprs.append(ast.unparse(node))
    return f"{{#{len(exprs) - 1}}}"


def _shown(template: str, exprs: list[str]) -> str:
    """The template with each ``{#i}`` back as ``{expression}``, as the source reads."""
    return re.sub(r"\{#(\d+)\}", lambda m: "{" + exprs[int(m[1])] + "}", template)


def _where(template: str) -> str | None:
    """The text inside the message's final "(...)", or None when it does not end with one."""
    text = template.rstrip()
    if not text.endswith(")"):
        return None
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            return text[i + 1 : -1]
    return None


def _is_place(item: str, exprs: list[str], *, field: bool = False) -> bool:
    item = item.strip()
    if field and _SECTION.fullmatch(item):
        return True
    if any(p.search(item) for p in (_OPTION, _FIELD, _PATH, _PID, _UNIT)):
        return True
    if _METAVAR.fullmatch(item) and item not in _ERRNO_NAMES:
        return True
    return any(
        _expr_is_place(ast.parse(exprs[int(i)], mode="eval").body)
        for i in re.findall(r"\{#(\d+)\}", item)
    )


def says_where(where: str, exprs: list[str]) -> bool:
    return any(_is_place(item, exprs) for item in re.split(r"[,;]", where))


def _error_classes(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Every exception class below ROOTS -> the keywords that carry its coordinates."""
    classes = {root: set(FIELDS.get(root, ())) for root in ROOTS}
    grown = True
    while grown:
        grown = False
        for tree in trees.values():
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef) or node.name in classes:
                    continue
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id in classes:
                        own = FIELDS.get(node.name, set())
                        classes[node.name] = own | classes[base.id]
                        grown = True
    return classes


def problems(trees: dict[str, ast.Module]) -> list[str]:
    classes = _error_classes(trees)
    found = []
    used = set()
    for rel, tree in sorted(trees.items()):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in classes:
                continue
            exprs: list[str] = []
            template = _template(node.args[0], exprs)
            site = f"{rel}:{node.lineno} {name}"
            shown = _shown(template, exprs)
            allowed = {(f, s) for f, s in ALLOW if rel == f and shown.startswith(s)}
            if allowed:
                used |= allowed
                continue
            given = {k.arg: k.value for k in node.keywords if k.arg in classes[name]}
            if given:
                for key, value in given.items():
                    if isinstance(value, ast.Constant) and value.value is None:
                        found.append(f"{site}: {key}=None is no where")
                    elif isinstance(value, ast.Constant) and isinstance(value.value, str):
                        word = value.value
                        if word not in KEYWORD_WORDS and not _is_place(
                            word, [], field=key == "field"
                        ):
                            found.append(f"{site}: {key}={word!r} is no where")
                if "option" in classes[name] and _where(template) is not None:
                    found.append(f"{site}: its own (...) and the class's: (...) (...)")
                continue
            where = _where(template)
            if where is None:
                found.append(f"{site}: no (where)")
            elif not says_where(where, exprs):
                found.append(f"{site}: {shown!r} names no file, field, cgroup, unit, pid, option")
    if "errors.py" in trees:  # the whole package: an entry that matches nothing goes
        found += [f"{f}: ALLOW entry {s!r} matches no raise" for f, s in sorted(ALLOW - used)]
    return found


def _package() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(PACKAGE)): ast.parse(path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_every_raised_error_says_where() -> None:
    found = problems(_package())
    assert found == [], "errors without a meaningful (where):\n" + "\n".join(found)


BAD = """
from governor.errors import UsageError, PolicyError
from governor.engines.llama import EngineArgvError
def f(x):
    raise UsageError(f"bad value {x} (command line)")
def g(x):
    raise UsageError(f"bad value {x}")
def h(x):
    raise PolicyError("bad", file="command line")
def i(x):
    raise EngineArgvError("engine option -c is bad (really)", option="-c")
def j(x):
    raise UsageError(f"bad value ({x.err})")
class MyError(UsageError):
    pass
def k(x):
    raise MyError("bad (systemd manager)")
def l(x, profile, files):
    raise UsageError("cannot open (ENOENT)")
    raise PolicyError("bad", file=None)
    raise UsageError(f"bad ({profile})")
    raise UsageError(f"bad ({len(files)})")
    raise UsageError(f"bad ({x.file_count})")
    raise UsageError(f"bad ({x.path_mode})")
"""
GOOD = """
def f(x, path, pid, unit, files):
    raise UsageError(f"bad value {x} (--engine-argv, --model)")
    raise UsageError(f"bad value {x} (-c/--ctx-size)")
    raise UsageError(f"cannot read: {x} ({path})")
    raise UsageError(f"gone (pid {pid})")
    raise UsageError(f"failed ({unit})")
    raise UsageError("too big (engine.max_context_tokens)")
    raise UsageError("nothing (KEY=VALUE)")
    raise UsageError(f"not found: {x} (-- ENGINE)")
    raise UsageError("no line (/proc/meminfo)")
    raise PolicyError("bad", file=str(path), field="memory.max")
    raise EngineArgvError("engine option -c is bad", option="-c/--ctx-size")
    raise UsageError("unknown class (qos.class)")
    raise UsageError("no such clock (clocks.big.max)")
    raise PolicyError("bad", file=str(path), field="qos.yield")
    raise PolicyError("bad", file=str(path), field="clocks")
    raise UsageError(f"bad ({str(path)})")
    raise UsageError(f"bad ({x.policy_path}, {x.option_b})")
    raise UsageError(f"bad ({', '.join(files)})")
    raise UsageError(f"bad ({x.get('source')})")
"""


def test_the_check_refuses_generic_and_missing_wheres() -> None:
    """The checker itself can fail: each planted bad site is reported, each good one is not."""
    trees = _package()  # the real classes: UsageError, PolicyError, EngineArgvError...
    bad = [b for b in problems({**trees, "bad.py": ast.parse(BAD)}) if b.startswith("bad.py")]
    lines = ["5", "7", "9", "11", "13", "17", "19", "20", "21", "22", "23", "24"]
    assert [b.split(":")[1].split()[0] for b in bad] == lines, bad
    assert [g for g in problems({**trees, "good.py": ast.parse(GOOD)}) if "good.py" in g] == []
