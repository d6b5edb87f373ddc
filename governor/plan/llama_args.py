"""llama.cpp's option grammar: which options take a value, which the governor reads, sizes,
warns of or skips, their LLAMA_ARG_* variables, and :func:`options`, the one walk of an argv by
those tables (issue 44 item 4); with it the part of an engine argv and environment a compile
reads: what the plan cache is keyed on.

Both lifetimes read it, so it sits with the shared records (plan/): the compile's argv parser
(governor/engines/llama.py), the router's presets (governor/engines/router.py), the plan cache's
key (governor/cache/plans.py), the readiness probe and the supervisor's model leaves. Standard
library only, nothing imported: this runs on every `governor launch` (governor/cache/plans.py
entry_name). llama.cpp's options that neither preflight nor the plan
look at (the prompt, the seed, sampling, --host/--port) are dropped with their values, so a new
prompt or port is a cache hit; every other word stays, in order (an option this module does not
know is kept: a miss, never a stale hit). llama.cpp's option tables are spelled here, once:
governor/engines/llama.py parse_llama_argv reads them too, so the words are walked exactly as
it walks them (which words take a value) and a value that looks like an option (`-p "-c 9"`) is
never read as one (tests/unit/plan/test_llama_args.py). The plan cache lives in the run time,
so this module imports nothing from engines/ (the one arrow that ran back up, issue 32).

--host/--port only say where llama-server's /health answers: api/launch.py derives that URL at
every launch (:func:`server_address`), never from the cache. A --host/--port the parser would
refuse (no value, not a port, an empty address list) makes the launch skip the cache
(:class:`Unkeyable`), so the compile refuses it as before: the checks are the ones llama.py
calls (:func:`port_problem`, :func:`host_problem`), not copies of them.

The first :data:`POSITIONAL` words after the program are never dropped: RKLLM's demo reads its
arguments by position (governor/engines/rkllm.py: ``llm_demo MODEL MAX_NEW_TOKENS
MAX_CONTEXT_LEN``), so for it `-p x` there is a count, not a prompt. Keeping a word is a miss at
worst, never a stale hit (tests/unit/cache/test_key_property.py checks that on generated argvs).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from governor.record import record

# llama.cpp's options, the one table: governor/engines/llama.py parse_llama_argv reads it too
# option -> canonical key; every one takes a value (as the next word or after "=")
READ_OPTS = {
    "-m": "model",
    "--model": "model",
    "-c": "ctx",
    "--ctx-size": "ctx",
    "-t": "threads",
    "--threads": "threads",
    "-lm": "load_mode",
    "--load-mode": "load_mode",
    "-b": "batch",
    "--batch-size": "batch",
    "-ub": "ubatch",
    "--ubatch-size": "ubatch",
    "-ctk": "cache_type_k",
    "--cache-type-k": "cache_type_k",
    "-ctv": "cache_type_v",
    "--cache-type-v": "cache_type_v",
    "-np": "parallel",
    "--parallel": "parallel",
    "-cram": "cache_ram",
    "--cache-ram": "cache_ram",
    "-ctxcp": "ctx_checkpoints",
    "--ctx-checkpoints": "ctx_checkpoints",
    "--swa-checkpoints": "ctx_checkpoints",
    "--host": "host",
    "--port": "port",
    # llama-server's router (tools/server: one child llama-server per model, on demand)
    "--models-dir": "models_dir",
    "--models-preset": "models_preset",
    "--models-max": "models_max",
    # a vision projector (tools/mtmd): its weights, encode buffer and image tokens
    "-mm": "mmproj",
    "--mmproj": "mmproj",
    "--image-max-tokens": "image_max_tokens",
}
# LLAMA_ARG_* variables of the same options (common/arg.cpp set_env); booleans below
ENV_OPTS = {
    "LLAMA_ARG_MODEL": "model",
    "LLAMA_ARG_CTX_SIZE": "ctx",
    "LLAMA_ARG_THREADS": "threads",
    "LLAMA_ARG_LOAD_MODE": "load_mode",
    "LLAMA_ARG_BATCH": "batch",
    "LLAMA_ARG_UBATCH": "ubatch",
    "LLAMA_ARG_CACHE_TYPE_K": "cache_type_k",
    "LLAMA_ARG_CACHE_TYPE_V": "cache_type_v",
    "LLAMA_ARG_N_PARALLEL": "parallel",
    "LLAMA_ARG_CACHE_RAM": "cache_ram",
    "LLAMA_ARG_CTX_CHECKPOINTS": "ctx_checkpoints",
    "LLAMA_ARG_HOST": "host",
    "LLAMA_ARG_PORT": "port",
    "LLAMA_ARG_MODELS_DIR": "models_dir",
    "LLAMA_ARG_MODELS_PRESET": "models_preset",
    "LLAMA_ARG_MODELS_MAX": "models_max",
    "LLAMA_ARG_MMPROJ": "mmproj",
    "LLAMA_ARG_IMAGE_MAX_TOKENS": "image_max_tokens",
}
TRUTHY = frozenset(["on", "enabled", "true", "1"])  # common_arg_utils::is_truthy
FALSEY = frozenset(["off", "disabled", "false", "0"])  # common_arg_utils::is_falsey
# options that change the engine's memory in ways the estimate does not size: named in a
# warning, never silently ignored (value-taking ones; flags in UNSIZED_FLAGS)
UNSIZED_VALUE_OPTS = {
    "-md": "--model-draft (a second model and its KV cache)",
    "--model-draft": "--model-draft (a second model and its KV cache)",
    "--spec-draft-model": "--model-draft (a second model and its KV cache)",
    "--lora": "--lora (adapter weights)",
    "--kv-unified-per-slot": "--kv-unified-per-slot (sizes the KV pool without -c)",
}
UNSIZED_FLAGS = {
    "--swa-full": "--swa-full (full-size SWA cache)",
}
# other options that take a value: skipped so that e.g. `-p "-c"` is not read as -c
SKIP_VALUE_OPTS = frozenset(
    [
        "-p",
        "--prompt",
        "-f",
        "--file",
        "-n",
        "--n-predict",
        "-s",
        "--seed",
        "--temp",
        "--top-k",
        "--top-p",
        "-ngl",
        "--n-gpu-layers",
        "-lv",
        "--verbosity",
        "-tb",
        "--threads-batch",
        "-fit",
        "--chat-template",
        "-sys",
        "--system-prompt",
        "--grammar",
        "--grammar-file",
        "-r",
        "--reverse-prompt",
        "--lora",
        "-md",
        "--model-draft",
        "-a",
        "--alias",
        "--slot-save-path",
    ]
)
FLAG_OPTS = {
    "--mlock": "mlock",
    "--no-mmap": "no_mmap",
    "-nr": "no_repack",
    "--no-repack": "no_repack",
    "--repack": "repack",
    "-kvu": "kv_unified",
    "--kv-unified": "kv_unified",
    "-no-kvu": "no_kv_unified",
    "--no-kv-unified": "no_kv_unified",
    "--no-mmproj": "no_mmproj",
    "--no-mmproj-offload": "no_mmproj_offload",
}
# every option that takes a value: the next word is that option's value, never an option
VALUE_OPTS = frozenset(READ_OPTS) | frozenset(UNSIZED_VALUE_OPTS) | SKIP_VALUE_OPTS
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
PORT_MAX = 65535  # a TCP port (the supervisor probes /health on it)
POSITIONAL = 3  # llm_demo MODEL MAX_NEW_TOKENS MAX_CONTEXT_LEN (engines/rkllm.py)
_HOST_OPTS = ("--host", "--port")
_DIGITS = frozenset("0123456789")
_SPACE = " \t\n\v\f\r"  # what std::stoi skips before a number (isspace in the C locale)


@record(frozen=True)
class Option:
    """One step of :func:`options`: an option with its value, or a word of its own. A record,
    not a NamedTuple: NamedTuple evaluates its string annotations with compile(), and a
    process's first compile() keeps ~200 KiB of the compiler's state for its life (the
    supervisor's, issue 44)."""

    name: str  # the option as llama.cpp spells it ("-c", "--ctx-size"), else the word itself
    # the next word, or what follows "=" (inline); None: a flag, a positional word, an option
    # this table does not know, or a value option with no word left after it
    value: str | None
    words: tuple[str, ...]  # the argv words of this step, as written
    at: int  # where its first word is (0: the word after the program)
    inline: bool = False  # written NAME=VALUE


def options(words: Sequence[str]) -> Iterator[Option]:
    """``words`` (an argv after its program) as llama.cpp's grammar splits them: an option of
    VALUE_OPTS takes the next word as its value whatever it looks like (`-p "-c 9"` is a
    prompt), ``NAME=VALUE`` of such an option is one step (inline); every other word is a step
    of its own. ``--`` ends the options: it comes last, as one step spanning it and every word
    after it."""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            yield Option(word, None, tuple(words[i:]), i)
            return
        name, eq, inline = word.partition("=")
        if eq and name in VALUE_OPTS:
            yield Option(name, inline, (word,), i, inline=True)
            i += 1
        elif word in VALUE_OPTS:
            value = words[i + 1] if i + 1 < len(words) else None
            yield Option(word, value, tuple(words[i : i + 2]), i)
            i += 2
        else:
            yield Option(word, None, (word,), i)
            i += 1


class Unkeyable(ValueError):
    """An argv whose dropped part the compile would refuse (a bad --port): no cache key."""


def last_value(cmdline: bytes, names: Sequence[str]) -> str | None:
    """The value of the last of ``names`` (short and long spellings, the long one last) in a
    process's /proc/<pid>/cmdline (pure), as llama.cpp reads it: through :func:`options` (an
    option's value is never an option: `-p --alias`), up to ``--``; written NAME=VALUE only in
    the long spelling. None when none is given."""
    words = [w.decode("utf-8", "surrogateescape") for w in cmdline.rstrip(b"\0").split(b"\0")]
    found: str | None = None
    for opt in options(words[1:]):
        if opt.name == "--":
            break
        if (
            opt.name in names
            and opt.value is not None
            and (not opt.inline or opt.name == names[-1])
        ):
            found = opt.value
    return found


def parse_int(raw: str) -> int | None:
    """An integer as llama.cpp's std::stoi reads an option: C-locale spaces, a sign, ASCII
    digits (no "1_000", no other scripts' digits, which Python's int() takes); None when it is
    not one or lies outside int32 (std::stoi throws out_of_range). Never more than int32's
    digits reach int(): Python refuses strings of over 4300 digits with its own ValueError."""
    text = raw.lstrip(_SPACE).rstrip(_SPACE)
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not set(digits) <= _DIGITS:
        return None
    if len(digits.lstrip("0")) > len(str(INT32_MAX)):
        return None
    n = int(text)
    return n if -INT32_MAX - 1 <= n <= INT32_MAX else None


def port_problem(raw: str) -> str | None:
    """Why llama-server's --port (LLAMA_ARG_PORT) cannot be used, None when it can: a TCP port,
    1-65535 (0, a port the kernel picks, leaves the governor no /health to probe)."""
    n = parse_int(raw)
    if n is None:
        return f"is not an integer: {raw[:40]!r}"
    if not 1 <= n <= PORT_MAX:
        return f"is not a TCP port (1-{PORT_MAX}): {raw[:40]!r}"
    return None


def host_problem(raw: str) -> str | None:
    """Why llama-server's --host (LLAMA_ARG_HOST) would be refused by the server itself: it
    splits the value at commas and needs one non-empty address (tools/server: "--host requires
    at least one address")."""
    if not any(part.strip(_SPACE) for part in raw.split(",")):
        return f"names no address: {raw[:40]!r}"
    return None


def unreachable(host: str | None, port: int | None) -> str | None:
    """Why the governor cannot know where llama-server answers HTTP (None: it can): a --host
    whose every entry is a UNIX socket (``.sock``, tools/server/server-http.cpp), or --port 0
    (the kernel picks the port). Spoken to at the default 127.0.0.1:8080 instead, another
    server there would be taken for it: its /health for this engine's, its models unloaded."""
    hosts = [a.strip(_SPACE) for a in (host or "").split(",") if a.strip(_SPACE)]
    if hosts and all(a.endswith(".sock") for a in hosts):
        return f"llama-server listens on a UNIX socket only (--host {(host or '')[:200]})"
    if port == 0:
        return "llama-server listens on a port the kernel picks (--port 0)"
    return None


def _address_ok(option: str, raw: str) -> bool:
    check = port_problem if option == "--port" else host_problem
    return check(raw) is None


def compile_words(argv: Sequence[str]) -> list[str]:
    """``argv`` without the options (and their values) no compile reads; Unkeyable when one
    of them holds what the parser refuses."""
    out: list[str] = list(argv[:1])
    for opt in options(argv[1:]):
        if opt.name == "--":
            out += opt.words
            break
        # every --host/--port is checked, kept or not: the last one given is the one read
        if opt.name in _HOST_OPTS and (opt.value is None or not _address_ok(opt.name, opt.value)):
            raise Unkeyable(opt.words[0])
        # only a long option's NAME=VALUE is dropped: keeping a word is a miss at worst
        long = not opt.inline or opt.name.startswith("--")
        if opt.name in IGNORED_OPTS and long and opt.at >= POSITIONAL:
            continue
        out += opt.words
    return out


def compile_env(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The engine's LLAMA_ARG_* variables the compile reads, sorted."""
    for var, option in (("LLAMA_ARG_PORT", "--port"), ("LLAMA_ARG_HOST", "--host")):
        if env.get(var, "") != "" and not _address_ok(option, env[var]):
            raise Unkeyable(var)
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
    for opt in options(argv[1:]):
        if opt.name == "--":
            break
        if opt.name in _HOST_OPTS and opt.value is not None:
            found[opt.name[2:]] = opt.value
    port = None if found.get("port") is None else parse_int(found["port"])
    return found.get("host"), port


def slot_save_path(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """llama-server's --slot-save-path (LLAMA_ARG_SLOT_SAVE_PATH; the command line overrides
    it, the last one wins); None when not given: its slots cannot be saved."""
    found = env.get("LLAMA_ARG_SLOT_SAVE_PATH") or None
    for opt in options(argv[1:]):
        if opt.name == "--":
            break
        if opt.name == "--slot-save-path" and opt.value is not None:
            found = opt.value or None
    return found
