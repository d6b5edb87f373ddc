"""The kinds of a rule's ``when``, spelled once (issue 44 item 2; style.md 14 and 16).

Each row says, for one trigger kind: how the policy spells it (``words``: the leading words
that pick its grammar; ``parse``: the function that reads the text, in policy/values.py;
``usage``: how the schema and the manual show it), how the compiler makes the plan's condition
of it (``compile``: a class with ``watch`` and ``text``, in compile/triggers.py; ``plan_text``:
the compiled condition as ``governor plan`` prints it), how the rule engine treats its evidence
(``semantics``, below), what the monitor samples for it (``sources``) and the function that
reads the evidence (``evidence``: ``(rule, state, now, observations) -> (evidence, value,
ended)``, in monitor/rules.py). Functions and classes are named by ``module:name`` and imported
on first use (:func:`load`), so the policy parser and the compiler read this table without the
run time's modules, and the run time without the compiler's. A new trigger is one row here (or
one :func:`register` call) plus its module; the parser, the compiler, the schema, the rule
engine and the monitor loop name no kind. Standard library only.

``semantics`` (monitor/rules.py): ``psi`` -- evidence is a PSI trigger event; an episode began
one window before its first event and lasts while events keep coming; without a cooldown every
event fires. ``event`` -- a counter that went up; each increase is its own episode. ``level``
-- evidence at every sample where the level is past its threshold; without a cooldown one
firing per episode.

``sources`` (monitor/loop.py fills rules.Observations with them): ``psi`` the PSI trigger armed
for the rule, ``events`` memory.events increases, ``memavailable`` /proc/meminfo MemAvailable,
``available`` that less the group's protected page cache, ``spare`` that less the board's
reserve, ``current`` the group's memory.current, ``device`` the group's device memory
(kernel/devmem.py), ``leak`` the anon slope over the rule's window (monitor/leak.py),
``refaults`` / ``board_refaults`` the group's / the board's refault share over the rule's window
(monitor/thrash.py), ``board_file`` the board's file cache (the file LRUs of /proc/meminfo); a
plug-in's own, read by the sampler it registers (:data:`SAMPLERS`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from typing import Any, Literal

from governor.record import record

Semantics = Literal["psi", "event", "level"]
Source = Literal[
    "psi", "events", "memavailable", "available", "spare", "current", "device", "leak",
    "refaults", "board_refaults", "board_file",
]  # fmt: skip

# memory.events counters a rule may react to (cgroup-v2.rst, "memory.events")
MEMORY_EVENTS = ("oom_kill", "oom_group_kill", "oom", "max", "high")


@record(frozen=True)
class Trigger:
    kind: str  # the plan's WatchCondition.condition ("psi": a WatchTrigger)
    # a regex matched at the start of the stripped text: the rows' grammars, in table order;
    # None: every text no row claims (exactly one row: its parse says what the forms are)
    words: str | None
    parse: str  # "module:function": the text -> the policy's condition (ValueError: why not)
    compile: str  # "module:Class": watch(condition, site) -> the plan's; text(compiled) -> str
    usage: str | None  # the schema's and the manual's spelling; None: shown with another row
    semantics: Semantics
    sources: tuple[str, ...]  # built-in: a Source; a plug-in's: a name in SAMPLERS
    evidence: str  # "module:function", the run time's
    # the compiled condition as `governor plan` prints it: str.format over threshold,
    # percent (threshold / 100), window_s and event
    plan_text: str = ""
    # the threshold is the slice's claimed peak: the engine's estimate replaces it at launch
    peak: bool = False


_PARSE = "governor.policy.values"
_COMPILE = "governor.compile.triggers"
_RULES = "governor.monitor.rules"

TRIGGERS: dict[str, Trigger] = {
    t.kind: t
    for t in (
        Trigger(
            "psi",
            None,
            "governor.policy.psi:parse_trigger",
            f"{_COMPILE}:Psi",
            "'[board|system] <memory|cpu|io> <some|full> <stall>/<window>', e.g. 'memory some"
            " 150ms/2s' (board/system: the whole board's /proc/pressure)",
            "psi",
            ("psi",),
            f"{_RULES}:psi_evidence",
        ),
        Trigger(
            "leak",
            r"leak",
            f"{_PARSE}:parse_leak",
            f"{_COMPILE}:Leak",
            "'leak > 500KB/s for 60s'",
            "level",
            ("leak",),
            f"{_RULES}:leak_evidence",
            "leak > {threshold}B/s for {window_s:g}s",
        ),
        Trigger(
            "memavailable",
            r"memavailable",
            f"{_PARSE}:parse_memavailable",
            f"{_COMPILE}:MemAvailable",
            "'memavailable < 800M' (or 'board available < 200M')",
            "level",
            ("memavailable",),
            f"{_RULES}:memavailable_evidence",
            "memavailable < {threshold}",
        ),
        Trigger(
            "headroom",
            r"board\s+available\s*<\s*headroom\s*$",
            f"{_PARSE}:parse_headroom",
            f"{_COMPILE}:Headroom",
            "'board available < headroom' (less than the slice's claimed peak still needs)",
            "level",
            ("spare", "current"),
            f"{_RULES}:headroom_evidence",
            "board available < headroom",
            peak=True,
        ),
        Trigger(
            "available",
            r"board\s+available",
            f"{_PARSE}:parse_memavailable",
            f"{_COMPILE}:MemAvailable",
            None,  # with memavailable
            "level",
            ("available",),
            f"{_RULES}:available_evidence",
            "board available < {threshold}",
        ),
        Trigger(
            "device",
            r"device",
            f"{_PARSE}:parse_device",
            f"{_COMPILE}:Device",
            "'device memory > 1.5G' (the group's DRM and dma-buf memory)",
            "level",
            ("device",),
            f"{_RULES}:device_evidence",
            "device memory > {threshold}",
        ),
        Trigger(
            "refaults",
            r"refaults",
            f"{_PARSE}:parse_refault_condition",
            f"{_COMPILE}:Refaults",
            "'refaults > 50%/10s' (file pages re-read in the window as a share of the file"
            " cache; 'board refaults': the whole board's)",
            "level",
            ("refaults",),
            f"{_RULES}:refaults_evidence",
            "refaults > {percent:g}%/{window_s:g}s",
        ),
        Trigger(
            "board_refaults",
            r"board\s+refaults",
            f"{_PARSE}:parse_refault_condition",
            f"{_COMPILE}:Refaults",
            None,  # with refaults
            "level",
            ("board_refaults",),
            f"{_RULES}:refaults_evidence",
            "board refaults > {percent:g}%/{window_s:g}s",
        ),
        Trigger(
            "board_file",
            r"board\s+file",
            f"{_PARSE}:parse_board_file",
            f"{_COMPILE}:BoardFile",
            "'board file < model' (the board's file cache below the engine's model size, or a"
            " size: a shed holds until the model fits in the cache again)",
            "level",
            ("board_file",),
            f"{_RULES}:board_file_evidence",
            "board file < {threshold}",
        ),
        Trigger(
            "event",
            rf"(?:{'|'.join(MEMORY_EVENTS)})$",
            f"{_PARSE}:parse_event",
            f"{_COMPILE}:Event",
            f"a memory.events counter: {', '.join(repr(e) for e in MEMORY_EVENTS)}",
            "event",
            ("events",),
            f"{_RULES}:event_evidence",
            "{event}",
        ),
    )
}


# the sources a plug-in adds: name -> "module:function" taking (fs, group, proc) and returning
# the level (None when unreadable), called at each sample when a plan's rule needs the source;
# the rule engine sees it in rules.Observations.levels[name]
SAMPLERS: dict[str, str] = {}

# the sources a per-rule meter makes of the samples, by "module:Class": imported only when a
# plan's rule samples the source (a plan without a leak rule never loads the leak detector)
METERS: dict[str, str] = {"leak": "governor.monitor.leak:LeakDetector"}


def register(trigger: Trigger) -> None:
    """Add (or replace) a trigger: a plug-in or a test. The parser, compiler and monitor see it
    (the schema's text is built when the policy models are imported)."""
    TRIGGERS[trigger.kind] = trigger


def unregister(kind: str) -> None:
    TRIGGERS.pop(kind, None)


def register_source(name: str, sampler: str) -> None:
    """Add a source the monitor samples with ``sampler`` ("module:function"), for a plug-in
    trigger whose level none of the built-in sources reads."""
    SAMPLERS[name] = sampler


def unregister_source(name: str) -> None:
    SAMPLERS.pop(name, None)


def row(kind: str) -> Trigger:
    """The row of ``kind``; KeyError for a kind that is not registered."""
    return TRIGGERS[kind]


def grammar_for(text: str) -> Trigger:
    """The row whose words start ``text`` (stripped), in table order; else the one row that
    takes every other text."""
    stripped = text.strip()
    fallback: Trigger | None = None
    for t in TRIGGERS.values():
        if t.words is None:
            fallback = fallback or t
        elif re.match(t.words, stripped):
            return t
    assert fallback is not None, "no trigger takes the texts no other row claims"
    return fallback


def fallback() -> Trigger:
    return next(t for t in TRIGGERS.values() if t.words is None)


def usage() -> str:
    """The kinds as the schema describes a rule's ``when``: "'...'; '...'; or ..."."""
    spelled = [t.usage for t in TRIGGERS.values() if t.usage is not None]
    return "; ".join(spelled[:-1]) + "; or " + spelled[-1]


def sources(kinds: Iterable[str]) -> frozenset[str]:
    """What the monitor samples for rules of these kinds."""
    return frozenset(s for k in kinds for s in TRIGGERS[k].sources)


def plan_text(kind: str, threshold: int, window_s: float | None, event: str | None) -> str:
    """A compiled condition as `governor plan` prints it (plan/model.py WatchCondition.text)."""
    return TRIGGERS[kind].plan_text.format(
        threshold=threshold, percent=threshold / 100, window_s=window_s, event=event
    )


def meter(source: str) -> Any:
    """The meter class of ``source`` (:data:`METERS`), imported on first use."""
    return load(METERS[source])


def load(path: str) -> Any:
    """The function or class a row names ("module:name"), imported on first use."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
