"""perf/router.py's pure parts: the arms, the request mix, one arm's result and the table with
its ratios against the governor's arm (tested on the host: tests/unit/perf/test_router.py)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

MIB = 1 << 20
MODELS = ("a", "b", "c")  # the three copies' aliases (the router names a model by its file)
# every request after the first two asks for a model that is not the last one asked for
PATTERN = "abcabcacbacb"
# variant c (eviction by value, issue 46 item 2): a is the slow model to load (small.gguf), b and
# c the quick ones (kvguest.gguf copies); when c needs room, a is the least recently used idle
# model and b the cheap one to bring back
PATTERN_C = "abc"


@dataclass(frozen=True)
class Variant:
    """What the router's children allocate: (a) little anonymous memory, so the overcommit is
    file pages (the weights, evicted and re-read); (b) a KV cache that makes each child's
    anonymous memory larger than two models' weights, so the same overcommit cannot be met by
    reclaim."""

    name: str
    flags: tuple[str, ...]
    memory_max: str  # fits two models' estimates (+ a leaf's headroom), not three
    pattern: str = PATTERN
    mixed: bool = False  # a: small.gguf, b and c: kvguest.gguf (else three small.gguf copies)


VARIANTS = {
    "a": Variant("a", ("-c", "512", "--cache-ram", "0", "-np", "1"), "628M"),
    "b": Variant("b", ("-c", "8192", "--cache-ram", "16", "-np", "1"), "1400M"),
    # estimates at -c 512 (governor estimate): a 273 MiB, b and c 50 MiB each, the router 23:
    # a and one quick model fit (346 MiB), a and both (396 MiB) do not; each request is the
    # next turn of that model's conversation, the router saves its slots under
    # --slot-save-path
    "c": Variant("c", ("-c", "512", "--cache-ram", "0", "-np", "1"), "375M", PATTERN_C, True),
}


@dataclass(frozen=True)
class Arm:
    # 1: router alone, --models-max 2; 2: alone, 3; 3: governor, evict = memory, 3; 4: as 3
    # with the evictor's order before issue 46 (least recently used first: perf/governor_lru.py)
    number: int
    variant: str

    @property
    def name(self) -> str:
        return f"{self.number}{self.variant}"

    @property
    def governed(self) -> bool:
        return self.number in (3, 4)

    @property
    def models_max(self) -> int:
        return 2 if self.number == 1 else 3

    def describe(self) -> str:
        who = {3: "governor, evict = memory", 4: "governor, evict = memory, LRU order"}
        return f"{who.get(self.number, 'router alone')}, --models-max {self.models_max}"


# variant c: the router alone (its own LRU by count), the governor by value and by LRU
ARMS = (*(Arm(n, v) for v in "ab" for n in (1, 2, 3)), Arm(1, "c"), Arm(3, "c"), Arm(4, "c"))


def parse_arms(text: str) -> list[Arm]:
    """`1a,2a,3b` -> those arms, in the order given; ValueError names an unknown one."""
    known = {a.name: a for a in ARMS}
    out = []
    for word in (w.strip() for w in text.split(",")):
        if word not in known:
            raise ValueError(f"unknown arm {word!r} (known: {','.join(known)})")
        out.append(known[word])
    return out


def mix(n: int, pattern: str = PATTERN) -> list[str]:
    """The models the n requests ask for, in order (``pattern`` repeated)."""
    return [pattern[i % len(pattern)] for i in range(n)]


@dataclass
class Result:
    arm: Arm
    round: int = 0  # perf/router --rounds: which round of its arm (perf/router_report.py)
    latencies: list[float] = field(default_factory=list)  # answered requests, seconds
    failed: int = 0
    oom_kills: int = 0  # memory.events oom_kill of the group (hierarchical: its leaves too)
    kernel_kills: int = 0  # "Killed process" lines in the kernel log during the arm
    peak: int | None = None  # bytes
    peak_source: str = ""
    refault_file: int = 0  # pages: workingset_refault_file, ready to the last answer
    page_size: int = 4096
    unloads: int = 0  # the governor's journaled unloads
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    # variant c: each load the client waited for (model, seconds: POST /models/load until the
    # router lists it loaded), and each turn that followed a reload: (seconds to its first
    # token, prompt tokens processed, whether the governor restored the model's slot)
    loads: list[tuple[str, float]] = field(default_factory=list)
    reloaded_turns: list[tuple[float, int, bool]] = field(default_factory=list)

    @property
    def reread_mib(self) -> float:
        return self.refault_file * self.page_size / MIB

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.latencies) if self.latencies else None

    @property
    def max_s(self) -> float | None:
        return max(self.latencies) if self.latencies else None


def ratio(value: float | None, base: float | None) -> str:
    """value / base as `1.23x`; `-` when either is missing or the base is 0."""
    if value is None or base is None or base == 0:
        return "-"
    return f"{value / base:.2f}x"


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def table(results: Sequence[Result]) -> str:
    """The markdown table: one row per arm, then the ratios of each arm to arm 3 of its variant."""
    head = ("| arm | requests failed | OOM kills (kernel log) | peak MiB | weights re-read MiB |"
            " latency median s | latency max s | governor unloads | wall s |")  # fmt: skip
    lines = [head, "|" + "---|" * 9]
    for r in results:
        peak = "-" if r.peak is None else f"{r.peak / MIB:.0f}"
        if r.peak is not None and r.peak_source != "memory.peak":
            peak += f" ({r.peak_source})"
        cells = (
            f"{r.arm.name}: {r.arm.describe()}",
            f"{r.failed} of {r.failed + len(r.latencies)}",
            f"{r.oom_kills} ({r.kernel_kills})",
            peak,
            f"{r.reread_mib:.0f}",
            _num(r.median_s),
            _num(r.max_s),
            str(r.unloads) if r.arm.governed else "-",
            f"{r.wall_s:.0f}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    gov = {r.arm.variant: r for r in results if r.arm.number == 3}
    rows = [r for r in results if not r.arm.governed and r.arm.variant in gov]
    if rows:
        lines += ["", "| arm / arm 3 | peak | weights re-read | latency median | latency max |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            g = gov[r.arm.variant]
            ratios = (
                f"{r.arm.name} / 3{r.arm.variant}",
                ratio(r.peak, g.peak),
                ratio(r.reread_mib, g.reread_mib),
                ratio(r.median_s, g.median_s),
                ratio(r.max_s, g.max_s),
            )
            lines.append("| " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def _turns(turns: Sequence[tuple[float, int, bool]], restored: bool) -> str:
    """`median s (median prompt tokens) xN` of the reloaded turns restored or not; `-`."""
    picked = [t for t in turns if t[2] == restored]
    if not picked:
        return "-"
    s = statistics.median(t[0] for t in picked)
    n = statistics.median(t[1] for t in picked)
    return f"{s:.1f} ({n:g} tok) x{len(picked)}"


def value_table(results: Sequence[Result]) -> str:
    """Variant c's table (eviction by value): per arm the requests failed, OOM kills, weights
    re-read, the loads the clients waited for (per model) and their seconds, the governor's
    unloads, and the next turn's time to first token after its model was reloaded, with and
    without its slot restored."""
    head = ("| arm | requests failed | OOM kills (kernel log) | weights re-read MiB |"
            " loads (a / b / c) | reload s spent | governor unloads |"
            " next-turn TTFT after a reload, restored: s (prompt tokens) | not restored |"
            " wall s |")  # fmt: skip
    lines = [head, "|" + "---|" * 10]
    for r in results:
        count = {m: sum(1 for name, _s in r.loads if name == m) for m in MODELS}
        cells = (
            f"{r.arm.name}: {r.arm.describe()}",
            f"{r.failed} of {r.failed + len(r.latencies)}",
            f"{r.oom_kills} ({r.kernel_kills})",
            f"{r.reread_mib:.0f}",
            " / ".join(str(count[m]) for m in MODELS),
            f"{sum(s for _m, s in r.loads):.1f}",
            str(r.unloads) if r.arm.governed else "-",
            _turns(r.reloaded_turns, True),
            _turns(r.reloaded_turns, False),
            f"{r.wall_s:.0f}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
