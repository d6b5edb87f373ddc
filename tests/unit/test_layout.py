"""The layout shows the architecture (issues 17 and 20): one folder per lifetime, no module over
500 lines, no import arrow that ties a lower layer to a higher one, no import circle, and no new
top-level module outside the short list of the ground floor.

Checked on the source with ast, nothing is imported: every ``import governor.x`` and
``from governor.x import y`` counts, at module level and inside functions (the lazy imports
that keep `governor launch` fast are still dependencies); imports under ``if TYPE_CHECKING:``
do not. ``from governor.x import y`` is an arrow to governor.x.y when that is a module.

The scripts beside the package, perf/ and ansible_collections/, are held to two of these lines
(issue 32): no import circle among them (function-level imports count there too), and they
never reach into tests/: no ``sys.path`` edit that adds a path under tests/, and no import of
a module that only tests/ puts on the path (``helpers.*``, ``engine.*``, ``tests.*``), whether
by an import statement or ``importlib.import_module``. tests/ may import perf/, not the other
way round (what both need lives in perf/_helpers/).

KNOWN_VIOLATIONS and KNOWN_LONG list what existed when the test was written and is being
removed: a new violation fails, and so does a listed one that is gone (delete it from the
list), so both lists only shrink.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "governor"
# the Python beside the package: the benchmarks and the Ansible collection's plugins
SCRIPT_DIRS = ("perf", "ansible_collections")
TESTS = REPO / "tests"
MAX_LINES = 500

KNOWN_LONG: frozenset[str] = frozenset()  # api.py, prefetch.py and values.py were, until 17

# imports inside a function anywhere in governor/ (ruff's PLC0415, on again with a short allow
# list in pyproject.toml): 221, 256, then 341 before issue 32, 155 after its first step, 86
# once api/ only wired (the lean path's lazy imports in main.py, cli/ and api/launch.py). An
# upper bound that only shrinks: lower it when the count falls (the test prints the count and
# the files holding most).
MAX_FUNCTION_LEVEL_IMPORTS = 86

# (importer, imported) pairs that break an arrow below and are still being removed. Empty as of
# f113497; at 2b226ba it held kernel.psi -> plan.model, monitor.{actions,loop} -> launch.restart
# and monitor.{actions,loop,rules} -> policy.values.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


def _tree(*names: str) -> tuple[str, ...]:
    """Patterns for each package or module and everything under it."""
    return tuple(p for name in names for p in (name, name + ".*"))


@dataclass(frozen=True)
class Arrow:
    """Modules matching ``importers`` (and not ``except_importers``) must not import modules
    matching ``forbidden`` (and not ``allowed``). Patterns are fnmatch over dotted names."""

    importers: tuple[str, ...]
    forbidden: tuple[str, ...]
    why: str
    allowed: tuple[str, ...] = ()
    except_importers: tuple[str, ...] = ()

    def applies(self, importer: str) -> bool:
        return _matches(importer, self.importers) and not _matches(importer, self.except_importers)

    def forbids(self, imported: str) -> bool:
        return _matches(imported, self.forbidden) and not _matches(imported, self.allowed)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(name, p) for p in patterns)


# the lifetimes (README "Layout"): compile time makes a plan, the run time runs one, the live board
# (operate/) and deployment act on what runs, the command line and the composition root wire it all
# plan/ holds the records both lifetimes read (the compiled plan, host facts, the unit table,
# placement records, the board file); the compiler and everything only a compile needs is in
# compile/ (issue 32)
SHARED = _tree("governor.plan")
COMPILE_TIME = _tree("governor.policy", "governor.compile", "governor.engines", "governor.init")
RUN_TIME = _tree(
    "governor.kernel",
    "governor.backends",
    "governor.launch",
    "governor.monitor",
    "governor.supervise",
    "governor.rundir",
    "governor.state",
    "governor.cache",
    "governor.peer",
    "governor.board",
)
WIRING = _tree("governor.api", "governor.cli")
# the one list of action verbs (issue 32): a stdlib-only table the policy parser reads; it names
# the run time's handlers by module path and imports none of them
VERB_REGISTRY = ("governor.monitor.actions.registry",)
# the one list of rule trigger kinds (issue 44): the same kind of table, read by the policy
# parser, the compiler and the plan's records; it names the run time's evidence functions and
# the compile time's grammars by module path and imports none of them
TRIGGER_REGISTRY = ("governor.monitor.triggers",)
REGISTRIES = (*VERB_REGISTRY, *TRIGGER_REGISTRY)

# the ground floor and the folders: a new top-level module must find its folder (or be added
# here with a reason)
TOP_LEVEL_MODULES = frozenset(
    {"__init__", "__main__", "main", "errors", "log", "record", "sizes", "atomic"}
)  # atomic: the one atomic file write, which the run time, deploy and the caches all use
TOP_LEVEL_PACKAGES = frozenset(
    {
        "api",
        "backends",
        "bench",
        "board",
        "cache",
        "cli",
        "compile",
        "deploy",
        "engines",
        "init",
        "kernel",
        "launch",
        "metrics",
        "monitor",
        "operate",
        "peer",
        "plan",
        "policy",
        "rundir",
        "state",
        "supervise",
    }
)

ARROWS = (
    Arrow(
        _tree("governor.board"),
        _tree("governor"),
        "the board's room (issue 44) reads the kernel, the run dir, peers' files and the plan's"
        " records; it never reaches the monitor, the supervisor, the live board's tools or the"
        " composition root",
        allowed=(
            *_tree("governor.board", "governor.kernel", "governor.rundir", "governor.peer"),
            *_tree("governor.plan"),
            "governor.record",
            "governor.errors",
            "governor.log",
            "governor.sizes",
        ),
    ),
    Arrow(
        _tree("governor.peer"),
        _tree("governor"),
        "the exchanges with other processes (issue 43) sit below every room that talks to a"
        " peer: they know the errors, records and log, nothing above them",
        allowed=("governor.errors", "governor.record", "governor.log", *_tree("governor.peer")),
    ),
    Arrow(
        _tree("governor.kernel"),
        _tree("governor"),
        "the kernel layer knows kernel files and errors, nothing above it",
        allowed=("governor.errors", "governor.record", *_tree("governor.kernel")),
    ),
    Arrow(
        _tree("governor.policy"),
        _tree(
            "governor.plan",
            "governor.compile",
            "governor.backends",
            "governor.launch",
            "governor.monitor",
        ),
        "a policy is data; what is made of it lives downstream",
        allowed=REGISTRIES,
    ),
    Arrow(
        SHARED,
        (*COMPILE_TIME, *_tree("governor.backends", "governor.launch", "governor.monitor")),
        "the shared records (plan/) are read by both lifetimes: they import neither the"
        " compiler nor the code that applies or runs a plan",
        allowed=TRIGGER_REGISTRY,
    ),
    Arrow(
        _tree("governor.compile"),
        _tree(
            "governor.backends",
            "governor.launch",
            "governor.monitor",
            "governor.engines",
            "governor.init",
        ),
        "the compiler is pure: it never reaches the code that applies or runs a plan",
        allowed=TRIGGER_REGISTRY,
    ),
    Arrow(
        COMPILE_TIME,
        (
            *_tree("governor.launch", "governor.monitor", "governor.supervise", "governor.rundir"),
            *_tree("governor.operate", "governor.deploy", "governor.bench", "governor.metrics"),
            *WIRING,
        ),
        "compile time makes a plan; it never reaches a run, the live board or deployment",
        allowed=REGISTRIES,
    ),
    Arrow(
        (*RUN_TIME, *SHARED),
        (*COMPILE_TIME, *_tree("pydantic", "typer", "click", "structlog", "dataclasses")),
        "the run time (a cached launch's supervisor) and the records it reads never import the"
        " compiler, the policy models, the engines' argv and estimate code, pydantic, typer,"
        " structlog or dataclasses, not even inside a function (issue 32: the lean supervisor,"
        " by structure)",
    ),
    Arrow(
        RUN_TIME,
        (*_tree("governor.operate", "governor.deploy", "governor.bench"), *WIRING),
        "the run time never imports the live board's tools, deployment, the composition root"
        " or the command line",
    ),
    Arrow(
        _tree("governor.operate"),
        _tree("governor.supervise", "governor.launch", "governor.monitor"),
        "the live board reads what a run leaves (rundir/) and the kernel; it never reaches into"
        " a run",
    ),
    Arrow(
        _tree("governor.monitor"),
        _tree("governor.policy", "governor.launch", "governor.supervise"),
        "the run time acts on the compiled plan, not on the policy or the launcher; the monitor"
        " sits below the supervisor that runs it (the router's client is in peer/: issue 44)",
    ),
    Arrow(
        _tree("governor.engines", "governor.policy", "governor.compile"),
        _tree("governor.init"),
        "`governor init` drafts a policy from the engines' estimate and the policy's loader;"
        " neither they nor the compiler know of the drafts (issue 44)",
    ),
    Arrow(
        ("governor.launch.prefetch*",),
        _tree("governor.launch.launcher"),
        "the launcher calls prefetch, not the other way round",
    ),
    Arrow(
        ("*",),
        _tree("governor.api"),
        "only the command line uses the composition root",
        except_importers=(*WIRING, "governor.main", "governor.__main__"),
    ),
    Arrow(
        ("*",),
        _tree("governor.cli"),
        "nothing but cli/ itself and the entry (main.py) imports the command line",
        except_importers=(*_tree("governor.cli"), "governor.main", "governor.__main__"),
    ),
)


# ------------------------------------------------------------------ reading the source


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _script_modules() -> dict[str, Path]:
    """perf/ and ansible_collections/'s Python files by dotted name."""
    return {_module_name(p): p for top in SCRIPT_DIRS for p in sorted((REPO / top).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """Every module a source file imports at run time (any depth), with its first line."""

    def __init__(
        self, module: str, is_package: bool, known: set[str], type_checking: bool = False
    ) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = known
        self.type_checking = type_checking  # count imports under ``if TYPE_CHECKING:`` too
        self.found: dict[str, int] = {}

    def _add(self, name: str, line: int) -> None:
        self.found.setdefault(name, line)

    def visit_If(self, node: ast.If) -> None:
        if self.type_checking or not _is_type_checking(node.test):
            self.visit(node.test)
            for stmt in node.body:
                self.visit(stmt)
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parent = self.package.split(".")[: len(self.package.split(".")) - (node.level - 1)]
            base = ".".join([*parent, *([base] if base else [])])
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            self._add(sub if sub in self.known else base, node.lineno)


def imports_of(
    source: str,
    module: str,
    *,
    is_package: bool = False,
    known: set[str] | None = None,
    type_checking: bool = False,
) -> dict[str, int]:
    """{imported module: line} for ``source`` as ``module``; ``known`` names the modules that
    ``from X import name`` can resolve to; ``type_checking``: imports under TYPE_CHECKING too."""
    visitor = _Imports(module, is_package, known or set(), type_checking)
    visitor.visit(ast.parse(source))
    return visitor.found


def _arrows() -> dict[tuple[str, str], str]:
    """{(importer, imported): where and why} for every import that breaks an arrow today."""
    modules = _modules()
    known = set(modules)
    out: dict[tuple[str, str], str] = {}
    for module, path in modules.items():
        found = imports_of(
            path.read_text(), module, is_package=path.name == "__init__.py", known=known
        )
        for imported, line in found.items():
            for arrow in ARROWS:
                if imported != module and arrow.applies(module) and arrow.forbids(imported):
                    where = f"{path.relative_to(REPO)}:{line}"
                    out[(module, imported)] = f"{where}: {module} -> {imported} ({arrow.why})"
    return out


def _graph(
    modules: dict[str, Path] | None = None, *, type_checking: bool = False
) -> dict[str, set[str]]:
    """{module: the modules of ``modules`` (default: governor's) it imports (any depth,
    TYPE_CHECKING excluded unless ``type_checking``)}."""
    modules = _modules() if modules is None else modules
    known = set(modules)
    out: dict[str, set[str]] = {}
    for module, path in modules.items():
        found = imports_of(
            path.read_text(),
            module,
            is_package=path.name == "__init__.py",
            known=known,
            type_checking=type_checking,
        )
        out[module] = {m for m in found if m in known and m != module}
    return out


def _mentions_tests(node: ast.AST) -> bool:
    """A string constant in ``node`` that names tests/ as a path part or a dotted module
    ("tests", "tests/helpers", "tests.engine.paths")."""
    return any(
        isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and "tests" in n.value.replace("\\", "/").replace(".", "/").split("/")
        for n in ast.walk(node)
    )


def _is_sys_path(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def reaches_into_tests(source: str, tests_names: frozenset[str]) -> dict[int, str]:
    """{line: what} for each place ``source`` reaches into tests/: a ``sys.path`` edit
    (insert, append, extend, assignment, +=) with a path under tests/, an import (any depth,
    TYPE_CHECKING included: mypy follows those too) whose top name is ``tests`` or one that
    only tests/ puts on the path (``tests_names``), or ``importlib.import_module`` of one."""
    out: dict[int, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if func.attr in ("insert", "append", "extend") and _is_sys_path(func.value):
                if any(_mentions_tests(a) for a in node.args):
                    out[node.lineno] = f"sys.path.{func.attr} of a path under tests/"
            elif func.attr == "import_module" and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    top = arg.value.split(".")[0]
                    if top == "tests" or top in tests_names:
                        out[node.lineno] = f"importlib.import_module({arg.value!r})"
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bare = [x.value if isinstance(x, ast.Subscript) else x for x in targets]
            if any(_is_sys_path(x) for x in bare) and _mentions_tests(node.value):
                out[node.lineno] = "sys.path set to a path under tests/"
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for name in names:
                top = (name or "").split(".")[0]
                if top == "tests" or top in tests_names:
                    out[node.lineno] = f"import of {name} (a module under tests/)"
    return out


def _tests_names() -> frozenset[str]:
    """The top-level names tests/ puts on sys.path for its own modules (helpers, engine, vm,
    conftest, ...): what a script could only import by reaching into tests/."""
    return frozenset(
        p.stem if p.suffix == ".py" else p.name
        for p in TESTS.iterdir()
        if (p.is_dir() and not p.name.startswith((".", "__"))) or p.suffix == ".py"
    )


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan): each is an
    import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# ------------------------------------------------------------------ the checks


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_500_lines_except_the_known_ones() -> None:
    long = {
        str(p.relative_to(REPO)): _lines(p) for p in _modules().values() if _lines(p) > MAX_LINES
    }
    new = {name: n for name, n in long.items() if name not in KNOWN_LONG}
    assert not new, f"modules over {MAX_LINES} lines, split them: {new}"
    fixed = sorted(KNOWN_LONG - set(long))
    assert not fixed, f"no longer over {MAX_LINES} lines, remove from KNOWN_LONG: {fixed}"


def function_level_imports(source: str) -> list[int]:
    """The lines of the import statements inside a function (any depth) of ``source``."""
    out: list[int] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, ast.Import | ast.ImportFrom):
                out.append(child.lineno)
            funcs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            visit(child, inside or isinstance(child, funcs))

    visit(ast.parse(source), False)
    return out


# typing's classes that evaluate their (string) annotations with compile() when the class is
# made: a process's first compile() keeps ~200 KiB of the compiler's state for its life, which
# a cached launch's supervisor otherwise never pays (issue 44: plan/llama_args.Option was one)
COMPILING_BASES = frozenset({"NamedTuple", "TypedDict"})


def compiling_classes(source: str) -> list[str]:
    """Classes in ``source`` whose base is one of COMPILING_BASES (bare or ``typing.``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name in COMPILING_BASES:
                    found.append(node.name)
    return found


def test_the_run_time_defines_no_class_that_compiles_its_annotations() -> None:
    bad = {
        module: names
        for module, path in _modules().items()
        if _matches(module, (*RUN_TIME, *SHARED)) and (names := compiling_classes(path.read_text()))
    }
    assert bad == {}, (
        f"NamedTuple/TypedDict classes on the run time's path: {bad}; use @record(frozen=True)"
        " (governor/record.py), which compiles nothing"
    )


def test_compiling_classes_finds_both_spellings_and_nothing_else() -> None:
    source = (
        "import typing\nfrom typing import NamedTuple\nclass A(NamedTuple):\n    x: int\n"
        "class B(typing.TypedDict):\n    y: str\nclass C(tuple):\n    pass\n"
    )
    assert compiling_classes(source) == ["A", "B"]


def test_function_level_imports_stay_under_the_bound() -> None:
    counts = {
        str(path.relative_to(REPO)): len(function_level_imports(path.read_text()))
        for path in _modules().values()
    }
    total = sum(counts.values())
    most = sorted(((n, f) for f, n in counts.items() if n), reverse=True)[:8]
    print(f"function-level imports in governor/: {total}; most: {most}")
    assert total <= MAX_FUNCTION_LEVEL_IMPORTS, (
        f"{total} imports inside functions, over the bound {MAX_FUNCTION_LEVEL_IMPORTS}: import"
        f" at module level unless it is the lean path's or an optional dependency's; most: {most}"
    )


def test_no_import_breaks_an_arrow_except_the_known_ones() -> None:
    found = _arrows()
    new = [why for pair, why in sorted(found.items()) if pair not in KNOWN_VIOLATIONS]
    assert not new, "imports against the layout:\n" + "\n".join(new)
    gone = sorted(KNOWN_VIOLATIONS - set(found))
    assert not gone, f"no longer imported, remove from KNOWN_VIOLATIONS: {gone}"


def test_known_violations_name_modules_that_exist() -> None:
    modules = set(_modules())
    stale = sorted({name for pair in KNOWN_VIOLATIONS for name in pair} - modules)
    assert not stale, f"KNOWN_VIOLATIONS names modules that do not exist: {stale}"
    missing = sorted(p for p in KNOWN_LONG if not (REPO / p).is_file())
    assert not missing, f"KNOWN_LONG names files that do not exist: {missing}"


def test_no_import_circle_anywhere_in_governor() -> None:
    found = circles(_graph())
    assert not found, "import circles (break them: a module each side imports both ways):\n" + (
        "\n".join(" <-> ".join(c) for c in found)
    )


# circles that only ``if TYPE_CHECKING:`` imports close (issue 32): mypy and a reader still
# follow them; this list only shrinks (monitor.actions <-> monitor.shed is gone, and
# engines.estimate <-> engines.server since Settings has its own module: issue 44)
KNOWN_TYPE_CIRCLES: list[list[str]] = []


def test_no_new_import_circle_counting_type_checking_imports() -> None:
    found = sorted(circles(_graph(type_checking=True)))
    new = [c for c in found if c not in KNOWN_TYPE_CIRCLES]
    gone = [c for c in KNOWN_TYPE_CIRCLES if c not in found]
    assert not new, "type-only import circles:\n" + "\n".join(" <-> ".join(c) for c in new)
    assert not gone, f"gone, delete from KNOWN_TYPE_CIRCLES: {gone}"


def test_no_import_circle_in_perf_or_the_ansible_collection() -> None:
    found = circles(_graph(_script_modules()))
    assert not found, (
        "import circles in perf/ or ansible_collections/ (move what both sides need into a"
        " module each imports):\n" + "\n".join(" <-> ".join(c) for c in found)
    )


def test_perf_and_the_ansible_collection_never_reach_into_tests() -> None:
    names = _tests_names()
    found = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in _script_modules().values()
        for line, what in sorted(reaches_into_tests(path.read_text(), names).items())
    ]
    assert not found, (
        "perf/ and ansible_collections/ must not reach into tests/ (tests/ may import perf/;"
        " put what both need in perf/_helpers/):\n" + "\n".join(found)
    )


def test_the_scripts_scanned_are_there() -> None:
    """The two checks above see the files they are meant to (a moved folder would make them
    pass on nothing)."""
    modules = _script_modules()
    assert {"perf.qos", "perf.qos_guest", "perf.server"} <= set(modules)
    assert any(m.startswith("ansible_collections.") for m in modules)
    assert {"helpers", "engine", "vm", "conftest"} <= _tests_names()
    graph = _graph(modules)
    # qos_guest's module-level import and qos's function-level one (in main) are both arrows
    assert {"perf.qos_common", "perf._helpers.disk", "perf.qos_guest"} <= graph["perf.qos"]
    assert "perf.qos_common" in graph["perf.qos_guest"]


def test_no_new_top_level_module() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    new = sorted((modules - TOP_LEVEL_MODULES) | (packages - TOP_LEVEL_PACKAGES))
    assert not new, (
        f"new at governor/'s top level: {new}; put it in the folder of its lifetime"
        ' (docs/development.md, "Layout"), or add it to TOP_LEVEL_* here with the line of that'
        " map that explains it"
    )
    gone = sorted((TOP_LEVEL_MODULES - modules) | (TOP_LEVEL_PACKAGES - packages))
    assert not gone, f"listed in TOP_LEVEL_* but gone: {gone}"


def test_the_manual_layout_map_names_every_folder_and_top_level_module() -> None:
    text = (REPO / "docs" / "development.md").read_text()
    block = text[text.index("## Layout") :].split("```")[1]
    named = {line.split()[0] for line in block.splitlines() if line.strip()}
    want = {f"governor/{m}.py" for m in TOP_LEVEL_MODULES - {"__init__"}}
    want |= {f"governor/{p}/" for p in TOP_LEVEL_PACKAGES}
    missing = sorted(want - named)
    assert not missing, f"docs/development.md's layout map does not name: {missing}"


# ------------------------------------------------------------------ the checker itself

SAMPLE = """
from __future__ import annotations
import os
import governor.plan.model
from typing import TYPE_CHECKING
from governor.kernel import files as kf
from governor.errors import GovernorError
from . import parse
from ..policy.values import parse_size
if TYPE_CHECKING:
    from governor.api import HostOptions
else:
    from governor.engines import llama

def lazy() -> None:
    from governor.launch.launcher import Launcher
"""


def test_imports_of_sees_function_level_and_relative_imports_but_not_type_checking() -> None:
    known = {"governor.kernel.files", "governor.kernel.parse", "governor.engines.llama"}
    found = imports_of(SAMPLE, "governor.kernel.psi", known=known)
    assert set(found) == {
        "__future__",
        "os",
        "typing",
        "governor.plan.model",
        "governor.kernel.files",
        "governor.errors",
        "governor.kernel.parse",
        "governor.policy.values",
        "governor.engines.llama",
        "governor.launch.launcher",
    }
    assert found["governor.launch.launcher"] == 16


@pytest.mark.parametrize(
    ("importer", "imported", "broken"),
    [
        ("governor.kernel.psi", "governor.errors", False),
        ("governor.kernel.psi", "governor.kernel.parse", False),
        ("governor.kernel.psi", "governor.plan.model", True),
        ("governor.kernel", "governor.log", True),
        ("governor.policy.loader", "governor.plan.host", True),
        ("governor.policy.loader", "governor.errors", False),
        ("governor.compile.compiler", "governor.policy.model", False),
        ("governor.compile.compiler", "governor.engines.llama", True),
        ("governor.monitor.loop", "governor.launch.restart", True),
        ("governor.monitor.loop", "governor.kernel.psi", False),
        ("governor.monitor.actions.unload", "governor.supervise.activity", True),
        ("governor.monitor.actions.unload", "governor.peer.router", False),
        ("governor.supervise.evict", "governor.peer.router", False),
        ("governor.launch.prefetch", "governor.launch.launcher", True),
        ("governor.launch.launcher", "governor.launch.prefetch", False),
        ("governor.deploy.install", "governor.api", True),
        ("governor.bench.main", "governor.cli.render", True),
        ("governor.cli.app", "governor.api", False),
        ("governor.cli.render", "governor.engines.estimate", False),
        ("governor.__main__", "governor.cli.app", False),
        ("governor.main", "governor.cli.choices", False),
        ("governor.api.launch", "governor.cli.options", True),
        ("governor.supervise.supervisor", "governor.operate.status", True),
        ("governor.backends.systemd", "governor.deploy.dropin", True),
        ("governor.rundir.state", "governor.api.host", True),
        ("governor.launch.launcher", "governor.cli.app", True),
        ("governor.operate.status", "governor.supervise.supervisor", True),
        ("governor.operate.tune", "governor.rundir.journal", False),
        ("governor.deploy.install", "governor.operate.tune", False),
        ("governor.engines.preflight", "governor.rundir.state", True),
        ("governor.compile.compiler", "governor.kernel.files", False),
        ("governor.compile.compiler", "governor.plan.model", False),
        ("governor.plan.unitmap", "governor.compile.compiler", True),
        ("governor.plan.placement", "governor.engines.llama", True),
        ("governor.monitor.loop", "governor.plan.model", False),
        ("governor.backends.systemd", "governor.plan.placement", False),
        ("governor.backends.systemd", "governor.compile.placements", True),
        ("governor.cache.plans", "governor.engines.llama", True),
        ("governor.init.draft", "governor.engines.estimate", False),
        ("governor.engines.budget", "governor.init.draft", True),
        ("governor.compile.compiler", "governor.init.draft", True),
        ("governor.supervise.supervisor", "governor.init.draft", True),
        ("governor.api.compile", "governor.init.draft", False),
        ("governor.cache.plans", "governor.plan.llama_args", False),
        ("governor.engines.llama", "governor.plan.llama_args", False),
        ("governor.supervise.models", "governor.plan.llama_args", False),
        ("governor.cache.plans", "governor.policy.model", True),
        ("governor.supervise.ready", "dataclasses", True),
        ("governor.launch.launcher", "pydantic.main", True),
        ("governor.rundir.state", "structlog", True),
        ("governor.monitor.actions", "typer", True),
        ("governor.operate.tune", "dataclasses", False),
        ("governor.plan.unitmap", "dataclasses", True),
    ],
)
def test_arrows_forbid_what_the_layout_says(importer: str, imported: str, broken: bool) -> None:
    assert any(a.applies(importer) and a.forbids(imported) for a in ARROWS) is broken


def test_circles_finds_each_circle_once_and_nothing_in_a_tree() -> None:
    tree = {"a": {"b", "c"}, "b": {"c"}, "c": set()}
    assert circles(tree) == []
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["d", "e"]]


REACHING = """
import sys
import importlib
from pathlib import Path
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

def later() -> None:
    sys.path.append("tests/helpers")
    from helpers.disk import loop_mount
    import engine.paths
    paths = importlib.import_module("tests.engine.paths")
    sys.path[:0] = [str(REPO / "tests")]
    sys.path += ["/opt/tests"]
    from perf._helpers import disk
    from .qos_common import Run
    import vmstat
"""


def test_reaches_into_tests_sees_path_edits_and_imports_at_any_depth() -> None:
    found = reaches_into_tests(REACHING, frozenset({"helpers", "engine", "vm"}))
    assert sorted(found) == [6, 10, 11, 12, 13, 14, 15]
    assert found[6] == "sys.path.insert of a path under tests/"
    assert found[11] == "import of helpers.disk (a module under tests/)"
    assert found[13] == "importlib.import_module('tests.engine.paths')"
    assert found[14] == found[15] == "sys.path set to a path under tests/"


def test_circles_are_found_among_the_scripts_with_function_level_imports() -> None:
    a = "from perf.b import x\n"
    b = "def main() -> None:\n    from perf.a import y\n"
    known = {"perf.a", "perf.b"}
    graph = {
        "perf.a": set(imports_of(a, "perf.a", known=known)) & known,
        "perf.b": set(imports_of(b, "perf.b", known=known)) & known,
    }
    assert circles(graph) == [["perf.a", "perf.b"]]


def test_function_level_imports_are_counted_at_any_depth_and_only_inside_functions() -> None:
    assert function_level_imports(SAMPLE) == [16]
    nested = "import os\nclass A:\n    def f(self):\n        if x:\n            import b\n"
    nested += "        def g():\n            from c import d\n"
    assert function_level_imports(nested) == [5, 7]
