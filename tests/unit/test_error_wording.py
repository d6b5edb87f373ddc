"""Every error the governor raises reads `governor: <what> (<where>)`: the message either gets
its coordinates from the error's fields (PolicyError file/field, BackendError cgroup/file) or
ends with its own "(...)". Checked on the source (AST), so a new raise site cannot forget it.

Needs: nothing (reads governor/*.py)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "governor"
ERRORS = {
    "HostError", "PolicyError", "PolicyNotFound", "UsageError", "LaunchError",
    "BackendError", "PermissionDenied", "OomReverted",
}  # fmt: skip
FIELDS = {
    "PolicyError": {"file", "field"},
    "PolicyNotFound": {"file", "field"},
    "BackendError": {"cgroup", "file", "errno"},
    "PermissionDenied": {"cgroup", "file", "errno"},
    "OomReverted": {"cgroup", "file"},
}
# the path is inside the message ("cannot probe host: /proc/meminfo: ..."), or the message is
# a missing Python package (the hint says which extra installs it)
INLINE = {
    ("plan/host.py", "HostError"),
    ("backends/systemd.py", "HostError"),
    ("bench/run.py", "HostError"),
    ("engines/gguf.py", "HostError"),
    ("plan/compiler.py", "HostError"),  # "...: controller memory is not available (<file>)"
}


def _tail(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        last = node.values[-1]
        return str(last.value) if isinstance(last, ast.Constant) else "{}"
    if isinstance(node, ast.BinOp):
        return _tail(node.right)
    return "{}"


def test_every_raised_error_says_where() -> None:
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in ERRORS or (rel, name) in INLINE:
                continue
            if {k.arg for k in node.keywords} & FIELDS.get(name, set()):
                continue
            if not _tail(node.args[0]).rstrip().endswith(")"):
                missing.append(f"{rel}:{node.lineno} {name}")
    assert missing == [], "errors without a (where): " + ", ".join(missing)
