"""pydantic without its plugin scan, and without importlib.metadata.

pydantic builds each model's validator through ``pydantic.plugin._schema_validator``, which
imports ``pydantic.plugin._loader`` on the first model and asks it for plugins: the loader
imports ``importlib.metadata`` (and with it email, zipfile, csv) and reads the entry points of
every distribution installed beside it, looking for the ``pydantic`` group. Governor uses no
pydantic plugin, and every command that builds the policy models paid for the scan: ~35 ms of
CPU on the host, seconds in the emulated test guests, where each distribution's metadata is a
file read over 9p (docs/development.md, "What each tier costs").

pydantic's own switch is an environment variable (PYDANTIC_DISABLE_PLUGINS), which skips the
scan but not the import, and which a launch would hand to its engine (the engine inherits
governor's environment). Instead this module, imported before the first model is defined,
puts a loader that finds no plugins where pydantic looks for it. A process that imported the
real loader first (a plugin user embedding governor) keeps it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable

# pydantic/plugin/_schema_validator.py, create_schema_validator: `from ._loader import get_plugins`
LOADER = "pydantic.plugin._loader"


def _no_plugins() -> Iterable[object]:
    return ()


if LOADER not in sys.modules:
    _stub = types.ModuleType(LOADER, "no pydantic plugin scan: governor/policy/noplugins.py")
    vars(_stub).update(get_plugins=_no_plugins)
    sys.modules[LOADER] = _stub
