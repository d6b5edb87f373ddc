"""The distribution's name and version: `governor` on PyPI is an unrelated project, so every
install hint the program prints must name this project's distribution, and the version has one
source (governor.__version__) that the package metadata and the plan cache key both read."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import governor
from governor.cache import plans

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DIST = PYPROJECT["project"]["name"]
# `pip install 'NAME[extra]'`, `pip install NAME`, `reinstall NAME` in the program's own text
HINT = re.compile(r"pip install '?([A-Za-z0-9_.-]+)\[|reinstall ([A-Za-z0-9_.-]+)")


def test_the_distribution_is_not_named_like_the_unrelated_pypi_project() -> None:
    assert DIST != "governor"
    assert PYPROJECT["project"]["scripts"] == {"governor": "governor.main:run"}


def test_every_install_hint_names_this_distribution() -> None:
    seen: dict[str, str] = {}
    for path in sorted((REPO / "governor").rglob("*.py")):
        for m in HINT.finditer(path.read_text()):
            seen[f"{path.relative_to(REPO)}: {m[0]}"] = m[1] or m[2]
    assert seen, "no install hint found: the pattern no longer matches the hints"
    wrong = {where: name for where, name in seen.items() if name != DIST}
    assert not wrong, f"hints that name another distribution than {DIST}: {wrong}"


def test_one_version_for_the_metadata_and_the_plan_cache() -> None:
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "governor.__version__"}
    assert governor.__version__ == plans.VERSION
    assert metadata.version(DIST) == governor.__version__
