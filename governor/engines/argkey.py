"""The part of an engine argv and environment a compile reads: what the plan cache is keyed on.

Standard library only, nothing imported: this runs on every `governor launch`
(governor/cache/plans.py entry_name). llama.cpp's options that neither preflight nor the plan
look at (the prompt, the seed, sampling, --host/--port) are dropped with their values, so a new
prompt or port is a cache hit; every other word stays, in order (an option this module does not
know is kept: a miss, never a stale hit). The words are walked exactly as
governor/engines/llama.py parse_llama_argv walks them (which words take a value), so a value
that looks like an option (`-p "-c 9"`) is never read as one; tests/unit/engines/test_argkey.py
checks that the tables below agree with that parser's.

--host/--port only say where llama-server's /health answers: api/launch.py derives that URL at
every launch (:func:`server_address`), never from the cache. A --port the parser would refuse
makes the launch skip the cache (:class:`Unkeyable`), so the compile refuses it as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# every option llama.py's parser reads a value for (its _VALUE_OPTS, _UNSIZED_VALUE_OPTS and
# _SKIP_VALUE_OPTS): the next word is that option's value, never an option
VALUE_OPTS = frozenset(
    [
        *("-m", "--model", "-c", "--ctx-size", "-t", "--threads", "-lm", "--load-mode"),
        *("-b", "--batch-size", "-ub", "--ubatch-size", "-ctk", "--cache-type-k"),
        *("-ctv", "--cache-type-v", "-np", "--parallel", "-cram", "--cache-ram"),
        *("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", "--host", "--port"),
        *("-mm", "--mmproj", "-md", "--model-draft", "--spec-draft-model", "--lora"),
        "--kv-unified-per-slot",
        *("-p", "--prompt", "-f", "--file", "-n", "--n-predict", "-s", "--seed", "--temp"),
        *("--top-k", "--top-p", "-ngl", "--n-gpu-layers", "-lv", "--verbosity", "-tb"),
        *("--threads-batch", "-fit", "--chat-template", "-sys", "--system-prompt"),
        *("--grammar", "--grammar-file", "-r", "--reverse-prompt"),
    ]
)
# of those, the ones whose value no compile reads (dropped from the key with their value)
IGNORED_OPTS = frozenset(
    [
        *("-p", "--prompt", "-f", "--file", "-n", "--n-predict", "-s", "--seed", "--temp"),
        *("--top-k", "--top-p", "-sys", "--system-prompt", "-r", "--reverse-prompt"),
        *("--grammar", "--grammar-file", "-lv", "--verbosity", "--host", "--port"),
    ]
)
# LLAMA_ARG_* variables the compile does not read either (the /health address)
IGNORED_ENV = frozenset(["LLAMA_ARG_HOST", "LLAMA_ARG_PORT"])
INT32_MAX = (1 << 31) - 1


class Unkeyable(ValueError):
    """An argv whose dropped part the compile would refuse (a bad --port): no cache key."""


def _port_ok(raw: str) -> bool:
    """What llama.py's _int accepts for --port (int(), not negative, within int32)."""
    try:
        n = int(raw)
    except ValueError:
        return False
    return 0 <= n <= INT32_MAX


def compile_words(argv: Sequence[str]) -> list[str]:
    """``argv`` without the options (and their values) no compile reads; Unkeyable when one
    of them holds what the parser refuses."""
    out: list[str] = list(argv[:1])
    words = list(argv[1:])
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            out += words[i:]
            break
        name, eq, inline = word.partition("=")
        if eq and name.startswith("--") and name in IGNORED_OPTS:
            if name == "--port" and not _port_ok(inline):
                raise Unkeyable(word)
            i += 1
            continue
        if word in IGNORED_OPTS:
            if word == "--port" and (i + 1 >= len(words) or not _port_ok(words[i + 1])):
                raise Unkeyable(word)
            i += 2
            continue
        if word in VALUE_OPTS and i + 1 < len(words):
            out += words[i : i + 2]
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def compile_env(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The engine's LLAMA_ARG_* variables the compile reads, sorted."""
    port = env.get("LLAMA_ARG_PORT", "")
    if port != "" and not _port_ok(port):
        raise Unkeyable("LLAMA_ARG_PORT")
    return sorted(
        (k, v) for k, v in env.items() if k.startswith("LLAMA_ARG_") and k not in IGNORED_ENV
    )


def server_address(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str | None, int | None]:
    """llama-server's --host/--port as parse_llama_argv reads them (the environment first, the
    command line overrides it; the last one given wins)."""
    found: dict[str, str] = {}
    for key, var in (("host", "LLAMA_ARG_HOST"), ("port", "LLAMA_ARG_PORT")):
        if env.get(var, "") != "":
            found[key] = env[var]
    words = list(argv[1:])
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            break
        name, eq, inline = word.partition("=")
        if eq and name in ("--host", "--port"):
            found[name[2:]] = inline
        elif word in ("--host", "--port") and i + 1 < len(words):
            found[word[2:]] = words[i + 1]
            i += 1
        elif word in VALUE_OPTS:
            i += 1
        i += 1
    port = found.get("port")
    return found.get("host"), None if port is None else int(port)
