"""Drive a real llama-server as its clients do: wait for /health, then chat through the
`openai` client (POST /v1/chat/completions), several conversations at once.

Used by perf/server.py and, through tests/helpers/server.py, the guests' server tests.
The synthetic models of scripts/engine-setup have an SPM vocab whose pieces include every
two-letter word ("▁ab"), so a prompt of N two-letter words is N tokens (the chatml template
adds ~50): `prompt(i, n)` gives conversation i its own words from the first token on, so no
two conversations share a prefix and each one's saved state (its tokens x the KV per token)
is a new entry in the server's prompt cache.
"""

from __future__ import annotations

import random
import socket
import string
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
from openai.types.chat import ChatCompletionMessageParam

from perf._helpers.engine_paths import BIN, CACHE

SERVER = BIN / "llama-server"
# 24 layers x n_embd 256: 24 KiB of KV per token, 13 MiB of weights, n_ctx_train 4096 (TCG scale)
KVGUEST = CACHE / "models" / "kvguest.gguf"
# 32 layers x n_embd 512: 64 KiB of KV per token, 64 MiB of weights (the host model)
KVSERVER = CACHE / "models" / "kvserver.gguf"
# the synthetic models carry no chat template; the web UI is not built
SERVER_ARGS = ("--chat-template", "chatml", "--no-webui")
TEMPLATE_TOKENS = 53  # chatml around one user message, measured with /apply-template + /tokenize


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick; released before the server binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(base: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of GET base/health (503 while loading), None if nothing answers."""
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, TimeoutError):
        return None


def wait_ready(
    base: str,
    proc: subprocess.Popen[str] | None = None,
    timeout: float = 120.0,
    interval: float = 0.1,
) -> float:
    """Poll base/health every `interval` s until it answers 200; the seconds it took. Fails
    at once if `proc` (the server, or the governor running it) exits first, with the tail of
    its stderr."""
    t0 = time.monotonic()
    while True:
        if health(base) == 200:
            return time.monotonic() - t0
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read()[-3000:] if proc.stderr else ""
            raise AssertionError(f"server exited {proc.returncode} before ready:\n{err}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{base}/health not 200 after {timeout:.0f} s")
        time.sleep(interval)


def prompt(i: int, words: int) -> str:
    """Conversation i's user message: `words` two-letter words (one token each), its own."""
    rng = random.Random(f"governor-server-{i}")
    letters = string.ascii_lowercase
    return " ".join(rng.choice(letters) + rng.choice(letters) for _ in range(words))


@dataclass
class Answer:
    index: int
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    seconds: float  # request to complete answer
    first_seconds: float | None  # request to the first streamed chunk with content


def client(base: str, timeout: float = 600.0) -> openai.OpenAI:
    """An OpenAI client for the server (no key, no retries: a failure is a failure)."""
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=timeout)


def chat(base: str, index: int, text: str, max_tokens: int = 4, stream: bool = False) -> Answer:
    """One conversation: one user message, `max_tokens` of answer (the synthetic model's
    words are noise; ignore_eos keeps it from stopping early). With stream=True the time to
    the first content chunk is measured too."""
    c = client(base)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": text}]
    extra = {"ignore_eos": True}
    t0 = time.perf_counter()
    if not stream:
        r = c.chat.completions.create(
            model="server", messages=messages, max_tokens=max_tokens, extra_body=extra
        )
        usage = r.usage
        return Answer(
            index=index,
            text=r.choices[0].message.content or "",
            finish_reason=r.choices[0].finish_reason,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            seconds=time.perf_counter() - t0,
            first_seconds=None,
        )
    first: float | None = None
    parts: list[str] = []
    finish: str | None = None
    prompt_tokens = completion_tokens = 0
    chunks = c.chat.completions.create(
        model="server",
        messages=messages,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    for chunk in chunks:
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
            completion_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                if first is None:
                    first = time.perf_counter() - t0
                parts.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    return Answer(
        index=index,
        text="".join(parts),
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        seconds=time.perf_counter() - t0,
        first_seconds=first,
    )


def converse(
    base: str, prompts: Sequence[str], workers: int = 2, max_tokens: int = 4
) -> list[Answer]:
    """Every prompt as its own conversation, `workers` of them in flight at once (as many
    clients of one server); the answers in prompt order. A failed request raises."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(chat, base, i, p, max_tokens) for i, p in enumerate(prompts)]
        return [f.result() for f in futures]


def server_argv(model: Path, port: int, *args: str, binary: Path = SERVER) -> list[str]:
    """llama-server for `model` on 127.0.0.1:port with the synthetic models' chat template."""
    return [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            *SERVER_ARGS, *args]  # fmt: skip
