"""llama-server router's own memory (issue 45 item 7): the router is a llama-server with no model
of its own (its children hold the models, each in its leaf), and what it holds itself counts
beside them. ONE figure, read where nothing is measured yet: `estimate`/`check`'s fits-together
arithmetic and `init --model DIR` (governor/engines/router.py, governor/init/router.py), and by
the evictor when the engine leaf's memory.current is unreadable (governor/supervise/evict.py:
the live figure when there is one). Standard library only (read by both lifetimes)."""

from __future__ import annotations

MIB = 1 << 20
# the engine's margin (binary, libs, threads: 15 MiB) + llama-server's HTTP threads and queues
# (8 MiB), the margins of governor/engines/estimate.py and server.py: a router is llama-server
# with no model. Measured: 12.6 MiB RSS (2.4 anon + 10.2 file) idle on the x86 host,
# llama.cpp 0c1e57098 (`llama-server --models-dir EMPTY`); the margin covers its threads at work
ROUTER_OWN_BYTES = 23 * MIB
