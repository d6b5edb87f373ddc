"""Drive a real llama-server as its clients do (/health, then the `openai` client):
perf/_helpers/server.py, which perf/server.py also uses (perf/ does not import from tests/)."""

from __future__ import annotations

from perf._helpers.server import (
    KVGUEST,
    KVSERVER,
    SERVER,
    SERVER_ARGS,
    TEMPLATE_TOKENS,
    Answer,
    chat,
    client,
    converse,
    free_port,
    health,
    prompt,
    server_argv,
    wait_ready,
)

__all__ = [
    "KVGUEST",
    "KVSERVER",
    "SERVER",
    "SERVER_ARGS",
    "TEMPLATE_TOKENS",
    "Answer",
    "chat",
    "client",
    "converse",
    "free_port",
    "health",
    "prompt",
    "server_argv",
    "wait_ready",
]
