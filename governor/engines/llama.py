"""What the governor reads from an engine's argv. It never changes the argv: the engine gets
exactly the bytes that followed ``--``.

llama.cpp flags (tools/common/arg.cpp of the version in notes/engine.md): ``-m/--model``,
``-c/--ctx-size`` (0 or absent = n_ctx_train from the GGUF), ``-t/--threads``,
``-lm/--load-mode none|mmap|mlock|mmap+mlock|dio`` (newer), ``--mlock``/``--no-mmap`` (older),
``-nr/--no-repack``, ``-b/--batch-size``, ``-ub/--ubatch-size``, ``-ctk/-ctv`` cache types.
llama-server adds ``-np/--parallel`` (slots; -1 or absent = auto: 4 slots sharing one unified KV
buffer), ``-kvu/--kv-unified`` / ``-no-kvu/--no-kv-unified``, ``-cram/--cache-ram`` (the prompt
cache in MiB: default 8192, -1 = no limit, 0 = off), ``-ctxcp/--ctx-checkpoints`` (per slot,
default 32) and ``--host``/``--port``.

llama.cpp reads each option from a ``LLAMA_ARG_*`` environment variable too (common/arg.cpp:
the environment is applied first, the command line overrides it), so the engine's environment
is read with the argv (:data:`governor.plan.llama_args.ENV_OPTS`). The option tables and the
walk by them are llama.cpp's grammar (governor/plan/llama_args.py, standard library only, the
plan cache key's too): spelled once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from governor.plan.llama_args import (
    ENV_OPTS,
    FALSEY,
    FLAG_OPTS,
    READ_OPTS,
    TRUTHY,
    UNSIZED_FLAGS,
    UNSIZED_VALUE_OPTS,
    host_problem,
    options,
    parse_int,
    port_problem,
    slot_save_path,
    unreachable,
)

# llama-server's defaults: what an absent option means, decided here and nowhere else (the
# EngineArgs.server_* methods below; the estimate, the preflight cap and init read those)
SERVER_CACHE_RAM_MIB = 8192  # --cache-ram (common/common.h cache_ram_mib)
SERVER_AUTO_SLOTS = 4  # -np absent or -1 (tools/server/server.cpp: 4 slots, unified KV)
SERVER_CTX_CHECKPOINTS = 32  # --ctx-checkpoints (common/common.h n_ctx_checkpoints)
# a flag given later turns its opposite off (the last one wins, as in llama.cpp)
_OPPOSITE = {
    "kv_unified": "no_kv_unified",
    "no_kv_unified": "kv_unified",
    "repack": "no_repack",
    "no_repack": "repack",
}
_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<n>\d{5})\.gguf$")


@dataclass(frozen=True)
class EngineArgs:
    """Facts found in an engine argv (None = not given)."""

    argv: tuple[str, ...]
    model: str | None = None
    ctx: int | None = None
    threads: int | None = None
    load_mode: str | None = None
    batch: int | None = None
    ubatch: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flags: frozenset[str] = field(default_factory=frozenset)
    # llama-server (None = not given: the server's default applies)
    parallel: int | None = None
    cache_ram: int | None = None  # MiB; -1 = no limit, 0 = prompt cache off
    ctx_checkpoints: int | None = None
    host: str | None = None
    port: int | None = None
    # options present that the estimate does not size (each: what it adds)
    unsized: tuple[str, ...] = ()
    # llama-server's router: where its models are, how many it loads at once (None: default)
    models_dir: str | None = None
    models_preset: str | None = None
    models_max: int | None = None
    # a vision projector (--mmproj) and the cap on one image's tokens (--image-max-tokens)
    mmproj: str | None = None
    image_max_tokens: int | None = None

    @property
    def server(self) -> bool:
        """Whether the program is llama-server (its slots and prompt cache count)."""
        return Path(self.argv[0]).name.startswith("llama-server") if self.argv else False

    @property
    def router(self) -> bool:
        """Whether llama-server runs as a router: no model of its own, its models from
        --models-dir / --models-preset (each loaded in a child llama-server on demand)."""
        return (
            self.server
            and self.model is None
            and (self.models_dir is not None or self.models_preset is not None)
        )

    @property
    def kv_unified(self) -> bool | None:
        """-kvu / -no-kvu as given (None: the server decides, unified when -np is auto)."""
        if "no_kv_unified" in self.flags:
            return False
        return True if "kv_unified" in self.flags else None

    @property
    def locks_memory(self) -> bool:
        """Whether the engine will mlock its weights itself."""
        return "mlock" in self.flags or (self.load_mode or "") in ("mlock", "mmap+mlock")

    @property
    def repacks(self) -> bool:
        return "no_repack" not in self.flags

    # llama-server as it will run: the option given, else its default
    @property
    def server_auto_slots(self) -> bool:
        """-np absent or -1: llama-server picks the slots (and unifies the KV buffer)."""
        return self.parallel is None or self.parallel < 0

    @property
    def server_slots(self) -> int:
        return SERVER_AUTO_SLOTS if self.server_auto_slots else (self.parallel or 1)

    @property
    def server_cache_ram_mib(self) -> int:
        """The prompt cache's cap in MiB: -1 no limit, 0 off."""
        return SERVER_CACHE_RAM_MIB if self.cache_ram is None else self.cache_ram

    @property
    def server_ctx_checkpoints(self) -> int:
        return SERVER_CTX_CHECKPOINTS if self.ctx_checkpoints is None else self.ctx_checkpoints


def is_gguf(args: EngineArgs | None) -> bool:
    """Whether the argv names a GGUF model (the estimate applies to it)."""
    return args is not None and args.model is not None and args.model.endswith(".gguf")


class EngineArgvError(ValueError):
    """An engine argv the governor cannot read (e.g. `-c abc`); ``str()`` ends with the option
    it is about, ``reason`` and ``option`` let a caller that adds its own coordinates (the
    policy check's "engine argv", estimate's --engine-argv) put them in one parenthesis."""

    def __init__(self, reason: str, *, option: str) -> None:
        super().__init__(f"{reason} ({option})")
        self.reason = reason
        self.option = option


def parse_llama_argv(
    argv: tuple[str, ...] | list[str], env: Mapping[str, str] | None = None
) -> EngineArgs:
    """Read llama.cpp's options out of ``argv`` (argv[0] is the program) and, when given, the
    engine's environment (``LLAMA_ARG_*``; the command line overrides it, as in llama.cpp)."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    unsized: list[str] = []
    for var, key in ENV_OPTS.items():
        if env is not None and env.get(var, "") != "":
            values[key] = env[var]
    if env is not None:
        _env_flags(env, flags)
    for opt in options(argv[1:]):
        name = opt.name
        if name == "--":
            break
        if name in READ_OPTS and (not opt.inline or name.startswith("--")):  # not "-c=9"
            if opt.value is None:
                raise EngineArgvError(f"engine option {name} has no value", option=name)
            values[READ_OPTS[name]] = opt.value
        elif name in FLAG_OPTS:
            key = FLAG_OPTS[name]
            flags.discard(_OPPOSITE.get(key, ""))
            flags.add(key)
        elif name in UNSIZED_VALUE_OPTS:
            unsized.append(UNSIZED_VALUE_OPTS[name])
        elif name in UNSIZED_FLAGS:
            unsized.append(UNSIZED_FLAGS[name])
    if "model" in values:
        model_parts(values["model"])  # a split name must name a part that exists
    _check_server_values(values)
    return EngineArgs(
        argv=tuple(argv),
        model=values.get("model"),
        ctx=_int(values, "ctx", "-c/--ctx-size"),
        threads=_int(values, "threads", "-t/--threads"),
        load_mode=values.get("load_mode"),
        batch=_int(values, "batch", "-b/--batch-size"),
        ubatch=_int(values, "ubatch", "-ub/--ubatch-size"),
        cache_type_k=values.get("cache_type_k"),
        cache_type_v=values.get("cache_type_v"),
        flags=frozenset(flags),
        parallel=_int(values, "parallel", "-np/--parallel"),
        cache_ram=_int(values, "cache_ram", "--cache-ram"),
        ctx_checkpoints=_int(values, "ctx_checkpoints", "--ctx-checkpoints"),
        host=values.get("host"),
        port=None if "port" not in values else parse_int(values["port"]),
        unsized=tuple(dict.fromkeys(unsized)),
        models_dir=values.get("models_dir"),
        models_preset=values.get("models_preset"),
        models_max=_int(values, "models_max", "--models-max"),
        mmproj=None if "no_mmproj" in flags else values.get("mmproj"),
        image_max_tokens=_int(values, "image_max_tokens", "--image-max-tokens"),
    )


def _env_flags(env: Mapping[str, str], flags: set[str]) -> None:
    """The boolean LLAMA_ARG_* variables (is_truthy / is_falsey of common/arg.cpp)."""
    unified = env.get("LLAMA_ARG_KV_UNIFIED", "").lower()
    if unified in TRUTHY:
        flags.add("kv_unified")
    elif unified in FALSEY:
        flags.add("no_kv_unified")
    if env.get("LLAMA_ARG_REPACK", "").lower() in FALSEY:
        flags.add("no_repack")


def address_warnings(args: EngineArgs | None, *, evict: bool) -> list[tuple[str, str]]:
    """llama-server whose HTTP address the governor cannot know (llama_args.unreachable): what it
    does without it (it never speaks to 127.0.0.1:8080 in its place), as a preflight warning."""
    why = unreachable(args.host, args.port) if args is not None and args.server else None
    if args is None or why is None:
        return []
    off = ["no readiness probe (ready at exec)"]
    if args.router:
        off += [*(['no evict = "memory"'] if evict else []), "no `unload`, no shed's unload"]
    return [
        (
            "engine.address",
            f"{why}: the governor cannot reach it: {', '.join(off)} (engine argv --host/--port);"
            " add a TCP address, e.g. --host 127.0.0.1 --port 8080",
        )
    ]


def slot_warnings(args: EngineArgs | None, *, evict: bool) -> list[tuple[str, str]]:
    """A router started with --slot-save-path whose slots the governor will not save (issue 46
    item 3: supervise/slots.py saves them before its evict = "memory" unloads only, and reads
    which to save from GET /slots), as a preflight warning; none otherwise."""
    if args is None or not args.router or slot_save_path(args.argv, {}) is None:
        return []
    words = {o.name for o in options(args.argv[1:])}
    if "--no-slots" in words:
        why = "--no-slots: a model's slots cannot be read (GET /slots), none is saved; drop it"
    elif not evict:
        why = (
            'the governor saves a model\'s slots only before its own evict = "memory" unloads:'
            " the router's --models-max evictions and the `unload` action lose them;"
            ' set [engine] evict = "memory"'
        )
    else:
        return []
    return [("engine.slots", f"--slot-save-path: {why}")]


def _check_server_values(values: dict[str, str]) -> None:
    """What llama-server refuses at start (tools/common/arg.cpp) or cannot run with, said
    before anything starts: -np 0, --host without an address, a --port that is no TCP port
    (the supervisor probes /health there; llama-server takes 99999 and logs "listening on
    http://127.0.0.1:99999"),
    -b 0 (llama-context.cpp aborts: GGML_ASSERT on n_outputs_max, measured on this build)."""
    if parse_int(values.get("parallel", "")) == 0:
        raise EngineArgvError(
            "engine option -np/--parallel is 0: llama-server refuses it", option="-np/--parallel"
        )
    if "host" in values and (why := host_problem(values["host"])) is not None:
        raise EngineArgvError(f"engine option --host {why}", option="--host")
    if "port" in values and (why := port_problem(values["port"])) is not None:
        raise EngineArgvError(f"engine option --port {why}", option="--port")
    if parse_int(values.get("batch", "")) == 0:
        raise EngineArgvError(
            "engine option -b/--batch-size is 0: llama.cpp aborts on it, a GGML_ASSERT",
            option="-b/--batch-size",
        )


_MINUS_ONE_OK = frozenset(["parallel", "cache_ram"])


def _int(values: dict[str, str], key: str, what: str) -> int | None:
    raw = values.get(key)
    if raw is None:
        return None
    # llama.cpp reads these with std::stoi: ASCII digits within int32 (llama_args.parse_int)
    n = parse_int(raw)
    if n is None:
        stripped = raw.strip().lstrip("+-")
        if stripped.isascii() and stripped.isdigit():
            raise EngineArgvError(
                f"engine option {what} is beyond llama.cpp's range: {raw[:40]!r}", option=what
            )
        raise EngineArgvError(f"engine option {what} is not an integer: {raw[:40]!r}", option=what)
    # llama.cpp: -t -1 = hardware concurrency, -np -1 = auto slots, --cache-ram -1 = no limit
    if n < 0 and not (key in _MINUS_ONE_OK and n == -1) and key != "threads":
        raise EngineArgvError(f"engine option {what} is negative: {raw[:40]!r}", option=what)
    return n


def model_parts(model: str) -> list[Path]:
    """A model path and, for split GGUFs (``x-00001-of-00003.gguf``), all its parts."""
    m = _SPLIT_RE.match(model)
    if not m:
        return [Path(model)]
    n = int(m["n"])
    if not 1 <= int(m["idx"]) <= n:
        raise EngineArgvError(
            f"split model {model!r} names part {m['idx']} of {m['n']}", option="-m/--model"
        )
    return [Path(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
