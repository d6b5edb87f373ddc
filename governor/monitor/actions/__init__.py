"""The actions of a fired rule, as registered handlers (issue 32).

``registry.py`` is the one list of verbs: the policy parser, the compiler, the generated manual
and the monitor read it, and it names each verb's handler class by module path, imported the
first time a plan uses the verb (a plan without `shed` never loads the shedder). ``base.py``
holds what every handler shares: the firing's :class:`~base.Context`, the :class:`~base.Result`
and the :class:`~base.Handler` lifecycle (``run`` per firing, ``tick`` per loop turn, ``close``
when the monitor stops, ``totals`` for the published state). ``executor.py`` dispatches. One
module per verb family: notify (log), command (exec), signals, limits (set, reclaim), freeze (freeze,
thaw), group (kill, restart), shed (shed, with shedder.py).

This package's ``__init__`` imports nothing: compile time reads the registry without the run
time's modules.
"""
