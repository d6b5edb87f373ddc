"""Pure parsers for the policy language's value syntax: sizes, durations, CPU specs, rule
conditions (the grammars governor/monitor/triggers.py names; a PSI trigger's in psi.py, the
thrash condition's in refaults.py) and action strings. Text in, typed values out; ValueError
with a short reason on bad input (the loader adds the file and field path)."""

from __future__ import annotations

import re
import shlex
import signal
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal

from governor.errors import shown as _shown
from governor.kernel.parse import format_cpu_max
from governor.monitor import triggers
from governor.monitor.actions import registry
from governor.policy.cpus import MAX_CPU, CpuSpec, parse_cpus
from governor.policy.durations import MAX_DIGITS as _MAX_DIGITS
from governor.policy.durations import Duration, parse_duration
from governor.policy.psi import PSI_WINDOW_MAX_US, PSI_WINDOW_MIN_US, PsiTrigger, parse_trigger
from governor.policy.refaults import BoardFileCondition, RefaultCondition, parse_refaults
from governor.sizes import BINARY, format_bytes, human_bytes

# re-exported: the compiler and tests spell v.format_bytes, v.parse_cpus, v.parse_trigger
__all__ = [
    "MAX_CPU",
    "PSI_WINDOW_MAX_US",
    "PSI_WINDOW_MIN_US",
    "CpuSpec",
    "PsiTrigger",
    "format_bytes",
    "human_bytes",
    "parse_cpus",
    "parse_trigger",
]

# ---------------------------------------------------------------- sizes

_BINARY = BINARY
# "MB" is ambiguous (10^6 for disk vendors, 2^20 for the kernel): refuse rather than guess.
_AMBIGUOUS = {"KB", "kB", "MB", "GB", "TB", "k", "m", "g", "t"}
_SIZE_RE = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$")
_PERCENT_RE = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*%\s*$")
# The kernel reads a size with memparse() (simple_strtoull: wraps silently past 2^64, so
# "16777216T" would be a 0-byte limit) and caps a page counter at LONG_MAX bytes: refuse what it
# would misread instead of writing it verbatim. Digits are capped before any arithmetic.
SIZE_MAX_BYTES = (1 << 63) - 1

SizeKind = Literal["bytes", "percent", "max", "model", "unlimited"]


@dataclass(frozen=True)
class Size:
    """A size as written in a policy: bytes, a share of MemTotal, "max", "model" or "unlimited"."""

    kind: SizeKind
    amount: Decimal = Decimal(0)  # bytes for "bytes", percent (0-100) for "percent"

    @property
    def bytes(self) -> int:
        if self.kind != "bytes":
            raise ValueError(f"{self} is not a byte count")
        return int(self.amount)

    def resolve(self, mem_total: int) -> int | None:
        """Bytes on a host with ``mem_total`` bytes; None for "max"/"unlimited"."""
        if self.kind == "bytes":
            return int(self.amount)
        if self.kind == "percent":
            return int(Decimal(mem_total) * self.amount / 100)
        if self.kind in ("max", "unlimited"):
            return None
        raise ValueError(f"{self} needs the model's size to resolve")

    def __str__(self) -> str:
        if self.kind == "bytes":
            return format_bytes(int(self.amount))
        if self.kind == "percent":
            return f"{self.amount.normalize():f}%"
        return self.kind


def parse_size(
    value: object,
    *,
    allow: frozenset[SizeKind] = frozenset({"bytes", "percent", "max"}),
) -> Size:
    """Parse an int (bytes) or a size string ("1.5GiB", "800M", "70%", "max")."""
    if isinstance(value, bool):
        raise ValueError("expected a size, got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return _checked(_bounded(Decimal(value), value), allow, value)
    if isinstance(value, Size):
        return _checked(value, allow, value)
    if not isinstance(value, str):
        raise ValueError(f"expected a size (int bytes or string like '1.5GiB'), got {value!r}")
    text = value.strip()
    if len(text) > _MAX_DIGITS + 8:
        raise ValueError(f"size {_shown(value, 40)} is too long; write 'max' for no limit")
    if text in ("max", "model", "unlimited"):
        return _checked(Size(text), allow, value)  # type: ignore[arg-type]  # narrowed by `in`
    if m := _PERCENT_RE.match(text):
        pct = Decimal(m["num"])
        if not 0 < pct <= 100:
            raise ValueError(f"percent must be in (0, 100], got {value!r}")
        return _checked(Size("percent", pct), allow, value)
    if text.startswith("-"):
        raise ValueError(f"size must not be negative, got {value!r}")
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"cannot parse size {value!r} (examples: 1.5GiB, 800M, 70%, max)")
    unit = m["unit"]
    if unit in _AMBIGUOUS:
        raise ValueError(f"ambiguous unit {unit!r} in {value!r}: use binary K/M/G (KiB/MiB/GiB)")
    if unit not in _BINARY:
        raise ValueError(f"unknown size unit {unit!r} in {value!r} (use B, K, M, G, T or KiB..TiB)")
    try:
        amount = Decimal(m["num"]) * _BINARY[unit]
    except InvalidOperation as err:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"cannot parse size {value!r}") from err
    # "1.1GiB" is not a whole number of bytes: round down (limits are page-rounded anyway)
    return _checked(_bounded(Decimal(int(amount)), value), allow, value)


def _bounded(amount: Decimal, raw: object) -> Size:
    if amount > SIZE_MAX_BYTES:
        raise ValueError(
            f"size {_shown(raw, 40)} is beyond what the kernel can hold ({SIZE_MAX_BYTES} bytes,"
            " 8 EiB); write 'max' for no limit"
        )
    return Size("bytes", amount)


def _checked(size: Size, allow: frozenset[SizeKind], raw: object) -> Size:
    if size.kind not in allow:
        allowed = ", ".join(sorted(allow))
        raise ValueError(f"{raw!r} is not allowed here (allowed kinds: {allowed})")
    return size


# ---------------------------------------------------------------- CPUs


@dataclass(frozen=True)
class CpuMax:
    """cpu.max as a share of one CPU: "350%" -> quota 350000 per 100000 us period."""

    percent: Decimal | None  # None = "max"

    def kernel_value(self, period_us: int = 100_000) -> str:
        quota = None if self.percent is None else int(self.percent * period_us / 100)
        return format_cpu_max(quota, period_us)

    def __str__(self) -> str:
        return "max" if self.percent is None else f"{self.percent.normalize():f}%"


# cpu.max quota must be >= 1000 us (kernel: cpu.cfs_quota_us minimum 1 ms)
CPU_MAX_MIN_QUOTA_US = 1000
# and at most max_cfs_runtime: MAX_BW = 2^(64 - BW_SHIFT) - 1 us (kernel/sched/core.c); above it
# the write fails with EINVAL at launch time
CPU_MAX_MAX_QUOTA_US = (1 << 44) - 1


def parse_cpu_max(value: object) -> CpuMax:
    if isinstance(value, CpuMax):
        return value
    if value == "max":
        return CpuMax(None)
    if (
        not isinstance(value, str)
        or len(value) > _MAX_DIGITS
        or not (m := _PERCENT_RE.match(value))
    ):
        shown = _shown(value, 40)
        raise ValueError(f"expected a share of one CPU like '350%' or 'max', got {shown}")
    pct = Decimal(m["num"])
    if pct * 100_000 / 100 < CPU_MAX_MIN_QUOTA_US:
        raise ValueError(f"cpu max {value!r} is below the kernel's 1 ms quota minimum (1%)")
    if pct * 100_000 / 100 > CPU_MAX_MAX_QUOTA_US:
        raise ValueError(
            f"cpu max {value!r} is beyond the kernel's quota limit"
            f" ({CPU_MAX_MAX_QUOTA_US // 1000}%); write 'max' for no limit"
        )
    return CpuMax(pct)


# ---------------------------------------------------------------- other conditions

MEMORY_EVENTS = triggers.MEMORY_EVENTS  # the counters a rule may react to
# a rate's size unit before "/s": binary like the kernel's "kB" in /proc (KB/kB = KiB here,
# because the seed writes "500KB/s" and /proc/<pid>/status spells KiB "kB")
_RATE_UNITS = {**_BINARY, "KB": 1 << 10, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
_LEAK_RE = re.compile(
    r"^\s*leak\s*>\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)/s\s+for\s+(?P<window>\S+)\s*$"
)
_MEMAVAIL_RE = re.compile(
    r"^\s*(?P<spelling>memavailable|board\s+available)\s*<\s*(?P<size>\S+)\s*$"
)
# the slope needs several samples: at 1 s sampling, 10 s gives 10 points
LEAK_WINDOW_MIN_US = 10_000_000


@dataclass(frozen=True)
class LeakCondition:
    """``leak > 500KB/s for 60s``: anon memory grew faster than ``rate`` over ``window``."""

    rate: int  # bytes per second
    window: Duration

    def __str__(self) -> str:
        if self.rate % 1024 == 0:
            return f"leak > {self.rate // 1024}KiB/s for {self.window}"
        return f"leak > {self.rate}B/s for {self.window}"


@dataclass(frozen=True)
class MemAvailableCondition:
    """``memavailable < 800M`` (or ``board available < 200M``, the QoS spelling): the
    board-wide floor (/proc/meminfo MemAvailable)."""

    below: int  # bytes
    board: bool = False  # spelled "board available"

    def __str__(self) -> str:
        name = "board available" if self.board else "memavailable"
        return f"{name} < {format_bytes(self.below)}"


@dataclass(frozen=True)
class HeadroomCondition:
    """``board available < headroom``: what the board can still give (MemAvailable less the
    group's protected page cache and the board's reserve) is less than what this slice is known
    to still need (its claimed peak less its memory.current): shed before the board is full."""

    def __str__(self) -> str:
        return "board available < headroom"


@dataclass(frozen=True)
class EventCondition:
    """``oom_kill``: a memory.events counter of the group went up."""

    event: Literal["oom_kill", "oom_group_kill", "oom", "max", "high"]

    def __str__(self) -> str:
        return self.event


@dataclass(frozen=True)
class DeviceMemoryCondition:
    """``device memory > 1.5G``: the group's DRM + dma-buf memory (governor/kernel/devmem.py)."""

    above: int  # bytes

    def __str__(self) -> str:
        return f"device memory > {format_bytes(self.above)}"


Condition = (
    PsiTrigger
    | LeakCondition
    | MemAvailableCondition
    | HeadroomCondition
    | EventCondition
    | DeviceMemoryCondition
    | RefaultCondition
    | BoardFileCondition
)
_DEVICE_RE = re.compile(r"^\s*device\s+memory\s*>\s*(?P<size>\S+)\s*$")
_BOARD_FILE_RE = re.compile(r"^\s*board\s+file\s*<\s*(?P<size>\S+)\s*$")


def parse_condition(value: object) -> Condition:
    """A rule's ``when``: the grammar of the first kind in monitor/triggers.py whose words start
    it (a PSI trigger, ``leak > R/s for W``, ``memavailable < SIZE``, ``board available <
    headroom``, ``[board] refaults > P%/W``, a memory.events name like ``oom_kill``...); a text
    no kind claims is read as a PSI trigger, whose error names the forms."""
    if isinstance(value, Condition):
        return value
    if not isinstance(value, str):
        return parse_trigger(value)
    parse: Callable[[str], Condition] = triggers.load(triggers.grammar_for(value).parse)
    return parse(value)


def parse_event(value: str) -> EventCondition:
    return EventCondition(value.strip())  # type: ignore[arg-type]  # the row's words: an event


def parse_leak(value: str) -> LeakCondition:
    m = _LEAK_RE.match(value.strip())
    if not m:
        raise ValueError(f"cannot parse {value!r} (form: 'leak > 500KB/s for 60s')")
    if m["unit"] not in _RATE_UNITS:
        raise ValueError(f"unknown rate unit {m['unit']!r}/s in {value!r} (use K, M, KiB...)")
    rate = int(Decimal(m["num"]) * _RATE_UNITS[m["unit"]])
    window = parse_duration(m["window"])
    if rate <= 0:
        raise ValueError(f"leak rate must be positive in {value!r}")
    if window.us < LEAK_WINDOW_MIN_US:
        raise ValueError(f"leak window {window} is too short for a slope (at least 10s)")
    return LeakCondition(rate, window)


def parse_memavailable(value: str) -> MemAvailableCondition:
    m = _MEMAVAIL_RE.match(value.strip())
    if not m:
        raise ValueError(
            f"cannot parse {value!r} (form: 'memavailable < 800M' or 'board available < 200M')"
        )
    if m["size"] == "headroom":  # "board available < headroom" is the headroom row's
        raise ValueError(
            f"headroom is compared with the board's available memory in {value!r}"
            " (form: 'board available < headroom')"
        )
    size = parse_size(m["size"], allow=frozenset({"bytes"}))
    if size.bytes == 0:
        raise ValueError(f"memavailable floor must be positive in {value!r}")
    return MemAvailableCondition(size.bytes, board=m["spelling"] != "memavailable")


def parse_headroom(value: str) -> HeadroomCondition:
    return HeadroomCondition()  # the row's words are the whole form


def parse_board_file(value: str) -> BoardFileCondition:
    if not (m := _BOARD_FILE_RE.match(value.strip())):
        raise ValueError(
            f"cannot parse {value!r} (form: 'board file < model' or 'board file < 1G')"
        )
    if m["size"] == "model":
        return BoardFileCondition(None)
    size = parse_size(m["size"], allow=frozenset({"bytes"}))
    if size.bytes == 0:
        raise ValueError(f"file cache floor must be positive in {value!r}")
    return BoardFileCondition(size.bytes)


def parse_refault_condition(value: str) -> RefaultCondition:
    return parse_refaults(value.strip())


def parse_device(value: str) -> DeviceMemoryCondition:
    if not (m := _DEVICE_RE.match(value.strip())):
        raise ValueError(f"cannot parse {value!r} (form: 'device memory > 1.5G')")
    return DeviceMemoryCondition(parse_size(m["size"], allow=frozenset({"bytes"})).bytes)


# ---------------------------------------------------------------- actions

# files an action may `set`, with whether relative (+/-N%) changes are meaningful
SETTABLE_FILES = (
    "memory.min",
    "memory.low",
    "memory.high",
    "memory.max",
    "memory.swap.max",
    "cpu.weight",
    "cpu.max",
)
_REL_RE = re.compile(r"^(?P<sign>[+-])(?P<num>[0-9]+(?:\.[0-9]+)?)%$")
_SWAPPINESS_RE = re.compile(r"^swappiness\s*=\s*(?P<n>[0-9]{1,3})$")
SWAPPINESS_MAX = 200  # vm.swappiness's range (mm/vmscan.c), memory.reclaim's too


@dataclass(frozen=True)
class Action:
    """One parsed action; ``str()`` gives the canonical spelling."""

    verb: str  # a verb of governor/monitor/actions/registry.py
    signal: str | None = None  # "SIGUSR1"
    size: Size | None = None  # reclaim amount / set absolute memory value
    file: str | None = None  # set: the file
    value: str | None = None  # set: absolute value as the kernel takes it
    relative_percent: Decimal | None = None  # set: +10 / -10
    duration: Duration | None = None  # freeze
    argv: tuple[str, ...] = ()  # exec
    swappiness: int | None = None  # reclaim: memory.reclaim's swappiness= (6.11)

    def __str__(self) -> str:
        if self.verb == "signal":
            return f"signal {self.signal}"
        if self.verb == "reclaim":
            balance = "" if self.swappiness is None else f" swappiness={self.swappiness}"
            return f"reclaim {self.size}{balance}"
        if self.verb == "set":
            if self.relative_percent is not None:
                sign = "+" if self.relative_percent > 0 else "-"
                return f"set {self.file} {sign}{abs(self.relative_percent).normalize():f}%"
            return f"set {self.file} {self.value}"
        if self.verb == "freeze":
            return f"freeze {self.duration}"
        if self.verb == "exec":
            return "exec " + shlex.join(self.argv)
        return self.verb


# Signals an action may send; SIGSTOP/SIGCONT are refused: use freeze/thaw (cgroup.freeze) instead.
_FORBIDDEN_SIGNALS = {"SIGSTOP", "SIGCONT"}


def parse_signal(name: str) -> str:
    canon = name if name.startswith("SIG") else f"SIG{name}"
    if canon in _FORBIDDEN_SIGNALS:
        raise ValueError(f"{canon} is not allowed; use 'freeze <duration>' / 'thaw'")
    valid = {s.name for s in signal.Signals}
    if canon not in valid or canon.startswith("SIG_"):
        raise ValueError(f"unknown signal {name!r}")
    return canon


def parse_action(value: object) -> Action:
    if isinstance(value, Action):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected an action string like 'reclaim 64M', got {value!r}")
    verb, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    spec = registry.VERBS.get(verb)
    if spec is None:
        known = ", ".join(registry.names())
        raise ValueError(f"unknown action {verb!r} in {value!r} (known: {known})")
    args = spec.args
    if args == "none":
        if rest:
            raise ValueError(f"action {verb!r} takes no argument, got {value!r}")
        return Action(verb)
    if args == "signal":
        if not rest or " " in rest:
            raise ValueError(f"expected 'signal <NAME>', e.g. 'signal SIGUSR1', got {value!r}")
        return Action(verb, signal=parse_signal(rest))
    if args == "size":
        amount, _, balance = rest.partition(" ")
        size = parse_size(amount, allow=frozenset({"bytes"}))
        if size.bytes == 0:
            raise ValueError(f"reclaim amount must be positive, got {value!r}")
        return Action(verb, size=size, swappiness=_swappiness(balance.strip(), value))
    if args == "duration":
        if not rest:
            raise ValueError(
                f"freeze needs a duration so it thaws by itself, e.g. 'freeze 5s', got {value!r}"
            )
        return Action(verb, duration=parse_duration(rest))
    if args == "set":
        return _parse_set(value, rest)
    try:  # "argv"
        argv = tuple(shlex.split(rest))
    except ValueError as err:
        raise ValueError(f"cannot split exec command {value!r}: {err}") from err
    if not argv:
        raise ValueError(f"exec needs a command, got {value!r}")
    return Action(verb, argv=argv)


def _swappiness(text: str, raw: str) -> int | None:
    """``swappiness=N`` after a reclaim's size: memory.reclaim's own argument (0: file pages
    only, 200: anon first; cgroup-v2.rst "memory.reclaim")."""
    if not text:
        return None
    m = _SWAPPINESS_RE.match(text)
    if not m or int(m["n"]) > SWAPPINESS_MAX:
        raise ValueError(
            f"expected 'reclaim SIZE [swappiness=0..{SWAPPINESS_MAX}]', e.g. 'reclaim 64M"
            f" swappiness=0', got {raw!r}"
        )
    return int(m["n"])


def _parse_set(raw: str, rest: str) -> Action:
    parts = rest.split()
    if len(parts) != 2:
        raise ValueError(f"expected 'set <file> <value|+N%|-N%>', got {raw!r}")
    file, arg = parts
    if file not in SETTABLE_FILES:
        raise ValueError(f"cannot set {file!r} (settable: {', '.join(SETTABLE_FILES)})")
    if m := _REL_RE.match(arg):
        if file == "cpu.max":
            raise ValueError(f"relative changes of cpu.max are not supported, got {raw!r}")
        pct = Decimal(m["num"])
        if pct == 0 or (pct >= 100 and m["sign"] == "-"):
            raise ValueError(f"relative change must be non-zero and above -100%, got {raw!r}")
        return Action("set", file=file, relative_percent=pct if m["sign"] == "+" else -pct)
    if file == "cpu.weight":
        if not arg.isdigit() or not 1 <= int(arg) <= 10000:
            raise ValueError(f"cpu.weight must be 1..10000, got {raw!r}")
        return Action("set", file=file, value=arg)
    if file == "cpu.max":
        return Action("set", file=file, value=str(parse_cpu_max(arg)))
    size = parse_size(arg, allow=frozenset({"bytes", "max"}))
    return Action("set", file=file, size=size, value=str(size))
