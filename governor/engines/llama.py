"""What the governor reads from an engine's argv. It never changes the argv: the engine gets
exactly the bytes that followed ``--``.

llama.cpp flags (tools/common/arg.cpp of the version in notes/engine.md): ``-m/--model``,
``-c/--ctx-size`` (0 or absent = n_ctx_train from the GGUF), ``-t/--threads``,
``-lm/--load-mode none|mmap|mlock|mmap+mlock|dio`` (newer), ``--mlock``/``--no-mmap`` (older),
``-nr/--no-repack``, ``-b/--batch-size``, ``-ub/--ubatch-size``, ``-ctk/-ctv`` cache types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# option -> canonical key; every one takes a value (as the next word or after "=")
_VALUE_OPTS = {
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
}
# other options that take a value: skipped so that e.g. `-p "-c"` is not read as -c
_SKIP_VALUE_OPTS = frozenset(
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
        "--mmproj",
        "-md",
        "--model-draft",
    ]
)
_FLAG_OPTS = {
    "--mlock": "mlock",
    "--no-mmap": "no_mmap",
    "-nr": "no_repack",
    "--no-repack": "no_repack",
}
INT32_MAX = (1 << 31) - 1
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

    @property
    def locks_memory(self) -> bool:
        """Whether the engine will mlock its weights itself."""
        return "mlock" in self.flags or (self.load_mode or "") in ("mlock", "mmap+mlock")

    @property
    def repacks(self) -> bool:
        return "no_repack" not in self.flags


def is_gguf(args: EngineArgs | None) -> bool:
    """Whether the argv names a GGUF model (the estimate applies to it)."""
    return args is not None and args.model is not None and args.model.endswith(".gguf")


class EngineArgvError(ValueError):
    """An engine argv the governor cannot read (e.g. `-c abc`)."""


def parse_llama_argv(argv: tuple[str, ...] | list[str]) -> EngineArgs:
    """Read llama.cpp's options out of ``argv`` (argv[0] is the program)."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    words = list(argv[1:])
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            break
        name, eq, inline = word.partition("=")
        if name in _VALUE_OPTS and name.startswith("--") and eq:
            values[_VALUE_OPTS[name]] = inline
        elif word in _VALUE_OPTS:
            if i + 1 >= len(words):
                raise EngineArgvError(f"engine option {word} has no value")
            values[_VALUE_OPTS[word]] = words[i + 1]
            i += 1
        elif word in _FLAG_OPTS:
            flags.add(_FLAG_OPTS[word])
        elif word in _SKIP_VALUE_OPTS:
            i += 1
        i += 1
    if "model" in values:
        model_parts(values["model"])  # a split name must name a part that exists
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
    )


def _int(values: dict[str, str], key: str, what: str) -> int | None:
    raw = values.get(key)
    if raw is None:
        return None
    try:
        n = int(raw)
    except ValueError as err:
        raise EngineArgvError(f"engine option {what} is not an integer: {raw!r}") from err
    if n < 0 and key != "threads":  # llama.cpp: -t -1 = hardware concurrency
        raise EngineArgvError(f"engine option {what} is negative: {raw!r}")
    if abs(n) > INT32_MAX:  # llama.cpp reads these with std::stoi
        raise EngineArgvError(f"engine option {what} is beyond llama.cpp's range: {raw[:40]!r}")
    return n


def model_parts(model: str) -> list[Path]:
    """A model path and, for split GGUFs (``x-00001-of-00003.gguf``), all its parts."""
    m = _SPLIT_RE.match(model)
    if not m:
        return [Path(model)]
    n = int(m["n"])
    if not 1 <= int(m["idx"]) <= n:
        raise EngineArgvError(f"split model {model!r} names part {m['idx']} of {m['n']}")
    return [Path(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
