"""The policy language: strict, frozen pydantic models. Unknown keys are rejected, nothing is
coerced ("true" is not a bool, "1G" is not an int). Value syntax lives in ``values.py``; the JSON
Schema (``governor schema``) shows the syntax users write."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from governor.kernel.leafname import refusal
from governor.monitor import triggers
from governor.policy import durations as d
from governor.policy import noplugins  # noqa: F401  # before the first model: no plugin scan
from governor.policy import values as v
from governor.policy.clocks import ClocksSection

UNIT_NAME_MAX = 255  # systemd: UNIT_NAME_MAX 256 including the NUL; also a file name's limit
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

_SIZE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "description": "bytes"},
        {
            "type": "string",
            "pattern": r"^\s*([0-9]+(\.[0-9]+)?\s*(B|K|KiB|M|MiB|G|GiB|T|TiB)?|[0-9]+(\.[0-9]+)?\s*%|max)\s*$",
            "description": "size ('1.5GiB', '800M'), share of MemTotal ('70%') or 'max'",
        },
    ]
}


def _size_field(
    allow: frozenset[v.SizeKind], schema: dict[str, Any]
) -> tuple[BeforeValidator, WithJsonSchema, PlainSerializer]:
    return (
        BeforeValidator(lambda x: v.parse_size(x, allow=allow)),
        WithJsonSchema(schema),
        PlainSerializer(lambda s: int(s.amount) if s.kind == "bytes" else str(s), return_type=Any),
    )


MemorySize = Annotated[v.Size, *_size_field(frozenset({"bytes", "percent", "max"}), _SIZE_SCHEMA)]
_PROTECT_SCHEMA = {
    "anyOf": [*_SIZE_SCHEMA["anyOf"], {"const": "model", "description": "model file size + margin"}]
}
ProtectSize = Annotated[
    v.Size, *_size_field(frozenset({"bytes", "percent", "max", "model"}), _PROTECT_SCHEMA)
]
_MEMLOCK_SCHEMA = {
    "anyOf": [
        *_SIZE_SCHEMA["anyOf"][:1],
        {"type": "string", "description": "size ('2GiB'), 'model' or 'unlimited'"},
    ]
}
MemlockSize = Annotated[
    v.Size, *_size_field(frozenset({"bytes", "model", "unlimited"}), _MEMLOCK_SCHEMA)
]
Duration = Annotated[
    d.Duration,
    BeforeValidator(d.parse_duration),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(us|ms|s|m|h)$"}),
    PlainSerializer(str, return_type=str),
]
Cpus = Annotated[
    v.CpuSpec,
    BeforeValidator(v.parse_cpus),
    WithJsonSchema(
        {"type": "string", "description": "'0-3,6', 'big', 'little' or 'all'"},
    ),
    PlainSerializer(str, return_type=str),
]
CpuMax = Annotated[
    v.CpuMax,
    BeforeValidator(v.parse_cpu_max),
    WithJsonSchema({"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?%|max)$"}),
    PlainSerializer(str, return_type=str),
]
# PlainValidator: what a kind's grammar returns is the condition (monitor/triggers.py), whatever
# its class; a union of the built-in classes would refuse a registered kind's
Trigger = Annotated[
    v.Condition,
    PlainValidator(v.parse_condition),
    WithJsonSchema(
        {
            "type": "string",
            # the kinds of monitor/triggers.py, in its order
            "description": triggers.usage(),
        }
    ),
    PlainSerializer(str, return_type=str),
]
ActionStr = Annotated[
    v.Action,
    BeforeValidator(v.parse_action),
    WithJsonSchema(
        {
            "type": "string",
            "description": "log | signal SIG | reclaim SIZE | set FILE VALUE|±N% | freeze DURATION"
            " | thaw | kill | exec ARGV... | restart | unload (a router's idle model)"
            " | shed (take memory from lower [qos] classes)",
        }
    ),
    PlainSerializer(str, return_type=str),
]
Weight = Annotated[StrictInt, Field(ge=1, le=10000)]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class MemorySection(_Section):
    min: ProtectSize | None = None
    low: ProtectSize | None = None
    high: MemorySize | None = None
    max: MemorySize | None = None
    swap_max: MemorySize | None = None
    zswap_max: MemorySize | None = None  # memory.zswap.max (5.19+): the group's zswap pool
    zswap_writeback: StrictBool | None = None  # memory.zswap.writeback (6.8+)
    oom_group: StrictBool | None = None

    @model_validator(mode="after")
    def _ordered(self) -> MemorySection:
        """min <= low <= high <= max wherever two values are comparable without the host."""
        order = [("min", self.min), ("low", self.low), ("high", self.high), ("max", self.max)]
        known = [(n, s) for n, s in order if s is not None and s.kind != "model"]
        for i, (lname, lo) in enumerate(known):
            for hname, hi in known[i + 1 :]:
                if _definitely_greater(lo, hi):
                    raise ValueError(f"memory.{lname} ({lo}) is above memory.{hname} ({hi})")
        return self


def _definitely_greater(a: v.Size, b: v.Size) -> bool:
    if b.kind == "max":
        return False
    if a.kind == "max":
        return True
    return a.kind == b.kind and a.amount > b.amount


class CpuSection(_Section):
    cpus: Cpus | None = None
    weight: Weight | None = None
    max: CpuMax | None = None


class IoSection(_Section):
    weight: Weight | None = None


# kernel/cgroup/pids.c refuses limit >= PIDS_MAX (PID_MAX_LIMIT + 1, 4 Mi on 64-bit)
PIDS_MAX_LIMIT = 4 * 1024 * 1024


def _pids_max(value: object) -> int | str:
    if value == "max":
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= PIDS_MAX_LIMIT:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > PIDS_MAX_LIMIT:
        raise ValueError(
            f"pids.max {value} is beyond the kernel's limit ({PIDS_MAX_LIMIT}); write 'max'"
            " for no limit"
        )
    raise ValueError(f"expected a positive integer or 'max', got {value!r}"[:120])


def _prefetch_files(value: object) -> str | tuple[str, ...]:
    if value == "auto":
        return "auto"
    if isinstance(value, list | tuple) and all(isinstance(f, str) and f for f in value):
        return tuple(value)
    raise ValueError(f"expected 'auto' or a list of paths/globs, got {value!r}")


class PidsSection(_Section):
    max: (
        Annotated[
            int | Literal["max"],
            BeforeValidator(_pids_max),
            WithJsonSchema(
                {
                    "anyOf": [
                        {"type": "integer", "minimum": 1, "maximum": PIDS_MAX_LIMIT},
                        {"const": "max"},
                    ]
                }
            ),
        ]
        | None
    ) = None


class ProcessSection(_Section):
    user: StrictStr | None = None
    group: StrictStr | None = None
    oom_score_adj: Annotated[StrictInt, Field(ge=-1000, le=1000)] | None = None
    nice: Annotated[StrictInt, Field(ge=-20, le=19)] | None = None
    memlock: MemlockSize | None = None
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    on_governor_exit: Literal["kill", "keep"] = "kill"
    # the `restart` action: relaunches per launch, and the first wait (doubles, capped at 60 s)
    restart_max: Annotated[StrictInt, Field(ge=0)] = 3
    restart_backoff: Duration = Field(
        default=d.Duration(1_000_000), json_schema_extra={"default": "1s"}
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"invalid environment variable name {key[:80]!r}")
            if "\0" in value:  # execve cannot pass it: the launch would fail in the child
                raise ValueError(f"environment variable {key} holds a NUL byte")
        return env

    @field_validator("user", "group")
    @classmethod
    def _account_name(cls, name: str | None) -> str | None:
        # useradd(8)'s portable name: what getpwnam can look up (a NUL raised ValueError there)
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?", name):
            raise ValueError(f"invalid user or group name {name[:80]!r}")
        return name


def _ready_url(url: str) -> str:
    """`ready`: "exec", or an http:// URL with a host and a port (no https: loopback health)."""

    if url == "exec":
        return url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise ValueError(f"not a URL with a valid port: {url[:80]!r}") from err
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(
            f'expected "exec" or http://HOST:PORT/PATH (e.g. http://127.0.0.1:8080/health),'
            f" got {url[:80]!r}"
        )
    return url


PROBE_MIN_S = 1.0  # a generation probe more often than this is load, not a probe


def _probe_interval(interval: d.Duration) -> d.Duration:
    """`probe_generate`: an interval of at least PROBE_MIN_S."""
    if interval.seconds < PROBE_MIN_S:
        raise ValueError(f"an interval of at least {PROBE_MIN_S:g}s, got {interval}")
    return interval


def _alias(name: str) -> str:
    """A router model's name, as llama-server names it (``org/tiny:Q8_0`` included): its leaf
    is kernel/leafname.py's mapping; a name that maps to none (a control character, '.',
    '..', empty) is refused here, at compile time, not at the child's start."""
    why = refusal(name)
    if why is not None:
        raise ValueError(f"model name {name[:40]!r} {why}: no cgroup leaf can be made for it")
    return name


class RouterModelSection(_Section):
    """[engine.models.<alias>]: the leaf of one model of llama-server's router (absent: the
    model's estimate + headroom as max)."""

    max: MemorySize | None = None
    high: MemorySize | None = None
    oom_group: StrictBool | None = None

    @model_validator(mode="after")
    def _ordered(self) -> RouterModelSection:
        if (
            self.high is not None
            and self.max is not None
            and _definitely_greater(self.high, self.max)
        ):
            raise ValueError(f"high ({self.high}) is above max ({self.max})")
        return self


class EngineSection(_Section):
    # rkllm: RKLLM's demo (llm_demo MODEL.rkllm MAX_NEW_TOKENS MAX_CONTEXT_LEN), its model in
    # NPU memory (device.memory defaults to the .rkllm file's size)
    kind: Literal["llama.cpp", "rkllm", "generic"] = "generic"
    max_context_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    # llama-server's prompt cache cap in MiB, as --cache-ram takes it (absent: no cap)
    max_cache_ram: Annotated[StrictInt, Field(ge=0, le=1 << 30)] | None = None
    threads: Annotated[StrictInt, Field(ge=1)] | None = None
    # the engine is ready when this answers 200 (llama-server: derived from --host/--port when
    # absent); "exec" = ready once exec'd (what a one-shot engine gets)
    ready: Annotated[StrictStr, AfterValidator(_ready_url)] | None = None
    ready_timeout: Duration = Field(
        default=d.Duration(300_000_000), json_schema_extra={"default": "300s"}
    )
    # liveness: ask the ready server for one token every interval (supervise/generate.py);
    # absent: off (its /health alone is asked, at the start)
    probe_generate: Annotated[Duration, AfterValidator(_probe_interval)] | None = None
    # llama-server's router: "count" = its own --models-max decides (check refuses one under
    # which the largest models cannot fit memory.max); "memory" = the governor makes room
    evict: Literal["count", "memory"] = "count"
    models: dict[Annotated[StrictStr, AfterValidator(_alias)], RouterModelSection] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _probe_needs_a_server(self) -> EngineSection:
        # a generic engine's URL may come from the launch (llama-server's --host/--port): one
        # that has none is told at the launch (engine.probe_unused)
        if self.probe_generate is not None and (self.ready == "exec" or self.kind == "rkllm"):
            raise ValueError(
                "probe_generate asks a server for a token: it needs engine.ready as the"
                f" server's http:// URL, not {self.ready!r} (kind {self.kind!r})"
            )
        return self


_DEVICE_SCHEMA = {
    "anyOf": [
        *_SIZE_SCHEMA["anyOf"][:1],
        {"type": "string", "description": "size ('1.2GiB') or 'model' (the model file's size)"},
    ]
}
DeviceSize = Annotated[v.Size, *_size_field(frozenset({"bytes", "model"}), _DEVICE_SCHEMA)]


class DeviceSection(_Section):
    """Memory the engine needs outside memcg's reach (NPU/GPU buffers): checked at preflight
    against what the board can give (MemAvailable, or CmaFree with pool = "cma") minus the
    other governed groups' memory.min."""

    memory: DeviceSize | None = None
    pool: Literal["system", "cma"] = "system"


class PrefetchSection(_Section):
    files: Annotated[
        Literal["auto"] | tuple[str, ...],
        BeforeValidator(_prefetch_files),
        WithJsonSchema(
            {"anyOf": [{"const": "auto"}, {"type": "array", "items": {"type": "string"}}]}
        ),
    ] = "auto"
    mode: Literal["none", "advise", "populate", "lock"] = "none"


class PressureRule(_Section):
    # `for` is the key (a Python keyword, hence the attribute for_); `for_` is not a key
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    when: Trigger
    for_: Duration | None = Field(default=None, alias="for")
    do: Annotated[tuple[ActionStr, ...], Field(min_length=1, strict=False)]
    cooldown: Duration | None = None


ShedStep = Literal["unload", "throttle", "freeze", "stop", "kill"]


class QosSection(_Section):
    """[qos]: the class among the board's workloads (issue 23) and what a higher class's `shed`
    may do to this slice (``yield``: never killed by a shed without "kill")."""

    class_: Literal["interactive", "standard", "background"] = Field(
        default="standard", alias="class"
    )
    yield_: Annotated[tuple[ShedStep, ...], Field(strict=False)] = Field(
        default=("unload", "throttle", "freeze", "stop", "kill"), alias="yield"
    )
    # what a launch or install does when this slice's peak does not fit beside the board's
    # other claims (issue 36; the guarantees never overcommit: "warn" and "refuse" refuse then)
    admit: Literal["warn", "refuse", "wait", "shed"] = "warn"
    admit_timeout: Duration = Field(
        default=d.Duration(60_000_000), json_schema_extra={"default": "60s"}
    )

    @field_validator("yield_")
    @classmethod
    def _unique(cls, steps: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(steps)) != len(steps):
            raise ValueError(f"a step is listed twice in {list(steps)}")
        return steps


class Policy(_Section):
    name: StrictStr
    description: StrictStr = ""
    extends: StrictStr | None = None
    slice: StrictStr = "governor.slice"
    memory: MemorySection = Field(default_factory=MemorySection)
    cpu: CpuSection = Field(default_factory=CpuSection)
    io: IoSection = Field(default_factory=IoSection)
    pids: PidsSection = Field(default_factory=PidsSection)
    process: ProcessSection = Field(default_factory=ProcessSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    prefetch: PrefetchSection = Field(default_factory=PrefetchSection)
    device: DeviceSection = Field(default_factory=DeviceSection)
    clocks: ClocksSection = Field(default_factory=ClocksSection)  # policy/clocks.py
    pressure: Annotated[tuple[PressureRule, ...], Field(strict=False)] = ()
    qos: QosSection = Field(default_factory=QosSection)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.fullmatch(name):
            raise ValueError(
                f"invalid policy name {name!r}: lower-case letters, digits, '_' and '-',"
                " starting with a letter or digit, at most 63 characters"
            )
        return name

    @field_validator("slice")
    @classmethod
    def _slice(cls, name: str) -> str:
        if "/" in name or ".." in name:
            raise ValueError(f"invalid slice {name!r}: no '/' and no '..'")
        if not name.endswith(".slice") or name == ".slice":
            raise ValueError(f"invalid slice {name!r}: must end in '.slice'")
        if not re.fullmatch(r"[A-Za-z0-9:_.\\-]+", name):
            raise ValueError(f"invalid slice {name[:80]!r}: only letters, digits and ':_.-\\'")
        if len(name) > UNIT_NAME_MAX:
            raise ValueError(f"invalid slice: longer than systemd's {UNIT_NAME_MAX} characters")
        stem = name.removesuffix(".slice")
        if stem != "-" and (stem.startswith("-") or stem.endswith("-") or "--" in stem):
            # systemd.slice(5): dashes separate the path; an empty component is no unit name
            raise ValueError(f"invalid slice {name!r}: '-' separates parent slices, never empty")
        return name
