"""The verbs of the policy language's actions, spelled once (issue 32; style.md 14).

Each entry says how the policy spells the verb's argument (``args``: what the parser in
governor/policy/values.py reads after the verb), its usage in the manual, and the handler
class that runs it, by module path: :func:`handler_class` imports it on first use, so the
compile time reads this table without the run time's modules, and the monitor loads only the
handlers its plan uses. A new verb is a new module and one entry here; nothing in the monitor
loop names a verb. Standard library only (the policy parser imports it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Literal

from governor.record import record

if TYPE_CHECKING:
    from governor.monitor.actions.base import Handler

# how a verb's argument is written: nothing, a signal name, a byte size, `FILE VALUE|+-N%`,
# a duration, a command line (shell words)
Args = Literal["none", "signal", "size", "set", "duration", "argv"]


@record(frozen=True)
class Verb:
    name: str
    args: Args
    handler: str  # "module:Class", the class a monitor runs it with
    usage: str  # how the manual spells it ("`signal SIG`")
    # what it does outlives the governor unless its watchdog reverts it (a shed's victims)
    watchdog: bool = False


_PKG = "governor.monitor.actions"

VERBS: dict[str, Verb] = {
    v.name: v
    for v in (
        Verb("log", "none", f"{_PKG}.notify:Log", "`log`"),
        Verb("signal", "signal", f"{_PKG}.signals:Signal", "`signal SIG`"),
        Verb("reclaim", "size", f"{_PKG}.limits:Limits", "`reclaim SIZE [swappiness=N]`"),
        Verb("set", "set", f"{_PKG}.limits:Limits", "`set FILE VALUE` or `set FILE -10%`"),
        Verb("freeze", "duration", f"{_PKG}.freeze:Freeze", "`freeze DURATION`"),
        Verb("thaw", "none", f"{_PKG}.freeze:Freeze", "`thaw`"),
        Verb("kill", "none", f"{_PKG}.group:Group", "`kill`"),
        Verb("exec", "argv", f"{_PKG}.command:Exec", "`exec ARGV...`"),
        Verb("restart", "none", f"{_PKG}.group:Group", "`restart` (launch only)"),
        Verb(
            "unload",
            "none",
            f"{_PKG}.unload:Unload",
            "`unload` (the least recently used idle model of this slice's router)",
        ),
        Verb(
            "shed",
            "none",
            f"{_PKG}.shed:Shed",
            "`shed` (take memory from slices of a lower [qos] class)",
            watchdog=True,
        ),
    )
}


def names() -> tuple[str, ...]:
    """The verbs in the manual's order."""
    return tuple(VERBS)


def usage() -> str:
    """The verbs as the manual lists them: "`log`, `signal SIG`, ... and `shed` (...)"."""
    spelled = [v.usage for v in VERBS.values()]
    return ", ".join(spelled[:-1]) + " and " + spelled[-1]


def register(verb: Verb) -> None:
    """Add (or replace) a verb: a plug-in or a test. The policy parser and the monitor see it."""
    VERBS[verb.name] = verb


def unregister(name: str) -> None:
    VERBS.pop(name, None)


def needs_watchdog(name: str) -> bool:
    """Whether a governor running ``name`` needs a watchdog should it die."""
    verb = VERBS.get(name)
    return verb is not None and verb.watchdog


def handler_class(name: str) -> type[Handler]:
    """The class that runs ``name``; KeyError for a verb that is not registered."""
    module, _, cls = VERBS[name].handler.partition(":")
    found: type[Handler] = getattr(importlib.import_module(module), cls)
    return found
