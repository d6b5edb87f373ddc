"""Bad input, generated: whatever a policy, a value, a GGUF header or an engine argv holds, the
governor answers with its own error (the documented exit code, one line, a hint) and never a
traceback. Policies include the board's sections ([qos], [clocks] in every frequency spelling,
[device]) and `shed` rules on board conditions; argvs include llama-server's (ports, slots,
the prompt cache, LLAMA_ARG_* variables) and RKLLM's demo's positional counts.

The generators write mostly WELL-FORMED but hostile input (small counts with matching payloads,
values at the kernel's limits, unknown keys, `extends` chains, nesting), so that most examples
get past the first check and reach the code behind it: most GGUF headers parse and go on to the
memory estimate, most policies pass the loader and reach the compiler. Each test counts how far
its examples got, prints one line (`-s`, and the terminal summary of tests/unit/conftest.py)
and asserts a floor, so a generator that drifts back to junk fails instead of passing quietly.

Replay: the hypothesis profile comes from tests/unit/conftest.py ("ci", derandomized, when
CI=true; otherwise "dev"); a failure prints a @reproduce_failure blob.

Needs: the host fixtures; the GGUF cases need the `gguf` package.
"""

from __future__ import annotations

import collections
import os
import re
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from governor.compile.compiler import Workload, compile_plan
from governor.engines.llama import EngineArgvError, parse_llama_argv
from governor.engines.preflight import engine_args
from governor.errors import GovernorError
from governor.plan.host import HostFacts, probe
from governor.plan.render import plan_table
from governor.policy.loader import load, load_text

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
# the board the policies are written for (the simplest draw), and hosts that reach the host
# checks: no big/LITTLE, no PSI and no memory controller, controllers held by cgroup v1
# (old-big-little has no cgroup2 mount: every policy would stop at the compiler's first line)
HOST_NAMES = ("rk3588", "rk3588", "rk3588", "cgroup2-full", "no-psi", "hybrid-host")
_HOSTS: dict[str, HostFacts] = {}


def _host(name: str) -> HostFacts:
    if name not in _HOSTS:
        _HOSTS[name] = probe(HOSTS / name)
    return _HOSTS[name]


Reach = collections.Counter[str]


def _check_error(err: GovernorError, codes: tuple[int, ...]) -> None:
    """What a user sees: `governor: <one line>` and `hint: <one line>`, a documented code."""
    assert err.exit_code in codes, (err.exit_code, str(err))
    assert "\n" not in str(err) and str(err).strip(), repr(str(err))
    assert err.hint and "\n" not in err.hint, (str(err), err.hint)
    assert "Traceback" not in str(err)


def _fraction(reach: Reach, stage: str) -> float:
    return reach[stage] / max(1, reach["examples"])


def _summary(what: str, reach: Reach, stages: tuple[str, ...]) -> str:
    parts = [f"{s} {reach[s]}/{reach['examples']} ({_fraction(reach, s):.0%})" for s in stages]
    return f"fuzz reach, {what}: " + ", ".join(parts)


# ---------------------------------------------------------------- hostile scalars

# values as hostile as the ones that broke things: bounds, digits, NUL, newlines, wrong types
_NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64, 4194304, 4194305, 10**400]),
)
_TEXTS = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "max",
            "model",
            "unlimited",
            "70%",
            "1e25%",
            "16777216T",
            "9" * 400,
            "big",
            "4-7",
            "0-8191",
            "a\nb",
            "x\x00y",
            "1.5GiB",
            "150ms",
            "9000h",
            "-5",
            "nan",
            "inf",
            "1e308",
            "memory some 150ms/2s",
            "leak > 500KB/s for 60s",
            "memavailable < 800M",
            "oom_kill",
            "set memory.high +10%",
            "freeze 5s",
            "exec sh -c 'x",
            "signal SIGNOPE",
        ]
    ),
)
_VALUES = st.one_of(
    _NUMBERS,
    _TEXTS,
    st.booleans(),
    st.floats(allow_nan=True),
    st.none(),
    st.lists(_TEXTS, max_size=3),
)


# Hypothesis draws the simplest choice (0, the first item) far more often than its share,
# especially late in a large example: the simplest choice is always the well-formed branch, and
# a hostile branch sits at the high end (it also shrinks towards well-formed input).
_PERCENT = st.integers(0, 99)


def _usually(draw: st.DrawFn, percent: int) -> bool:
    """True in about ``percent`` % of examples (and when the draw is the simplest)."""
    return draw(_PERCENT) < percent


def _rarely(draw: st.DrawFn, percent: int) -> bool:
    """True in about ``percent`` % of examples (never when the draw is the simplest)."""
    return not _usually(draw, 100 - percent)


# ---------------------------------------------------------------- policy values near the limits

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
          "G": 1 << 30, "GiB": 1 << 30, "T": 1 << 40, "TiB": 1 << 40}  # fmt: skip
SIZE_MAX_BYTES = (1 << 63) - 1  # the kernel's page counter: LONG_MAX bytes


@st.composite
def _byte_size(draw: st.DrawFn) -> tuple[object, int]:
    """A size in bytes as a policy writes it, with its byte value (limits included)."""
    edge = draw(st.integers(0, 9))
    if edge == 9:
        n = draw(st.sampled_from([0, 1, 4095, 4096, SIZE_MAX_BYTES, SIZE_MAX_BYTES + 1]))
        return n, n
    if edge == 8:  # the largest that fits, and the first that does not
        text = draw(st.sampled_from(["8388607T", "8388608T", "8589934591G", "8589934592GiB"]))
        num, unit = re.fullmatch(r"([0-9]+)(\D*)", text).groups()  # type: ignore[union-attr]
        return text, int(num) * _UNITS[unit]
    unit = draw(st.sampled_from(sorted(_UNITS)))
    num = draw(st.integers(1, 4096))
    if draw(st.booleans()):
        frac = draw(st.integers(1, 99))
        return f"{num}.{frac:02d}{unit}", (num * 100 + frac) * _UNITS[unit] // 100
    if unit == "" and draw(st.booleans()):
        return num * 4096, num * 4096  # an integer of bytes
    return f"{num}{unit}", num * _UNITS[unit]


_SIZE = _byte_size()
_SIZE_TEXT = _SIZE.map(lambda s: s[0])


def _percent(draw: st.DrawFn) -> tuple[str, float]:
    pct = draw(st.sampled_from(["0.01", "0.5", "1", "10", "50", "70", "99.99", "100"]))
    return f"{pct}%", float(pct)


_DURATION_UNITS = {"us": 1, "ms": 1000, "s": 10**6, "m": 60 * 10**6, "h": 3600 * 10**6}


@st.composite
def _duration(draw: st.DrawFn, lo_us: int = 1, hi_us: int = 366 * 86400 * 10**6) -> str:
    """A duration between lo_us and hi_us (a year: the governor's cap), in some unit."""
    if _rarely(draw, 15):
        edge = draw(st.sampled_from([lo_us, hi_us]))
        return f"{edge}us" if edge % 1000 else f"{edge // 1000}ms"
    unit = draw(st.sampled_from(sorted(_DURATION_UNITS)))
    mult = _DURATION_UNITS[unit]
    lo, hi = -(-lo_us // mult), hi_us // mult
    assume(lo <= hi)
    return f"{draw(st.integers(lo, min(hi, lo + 5000)))}{unit}"


_DURATION = _duration()


@st.composite
def _memory_section(draw: st.DrawFn) -> dict[str, object]:
    """min <= low <= high <= max as the loader demands (bytes among bytes, percent among
    percent, "max" last); bytes against percent is left for the compiler to resolve."""
    out: dict[str, object] = {}
    keys = [k for k in ("min", "low", "high", "max") if draw(st.booleans())]
    sizes = sorted(draw(st.lists(_SIZE, min_size=len(keys), max_size=len(keys))),
                   key=lambda s: s[1])  # fmt: skip
    pcts = sorted((_percent(draw) for _ in keys), key=lambda p: p[1])
    seen_max = False
    for i, key in enumerate(keys):
        kind = draw(st.integers(0, 9))
        if seen_max or (kind == 0 and i == len(keys) - 1):
            out[key], seen_max = "max", True
        elif kind <= 2:
            out[key] = pcts[i][0]
        elif kind == 3 and key in ("min", "low"):
            out[key] = "model"
        else:
            out[key] = sizes[i][0]
    if draw(st.booleans()):
        out["swap_max"] = draw(st.one_of(st.just("0"), st.just("max"), _SIZE_TEXT))
    if draw(st.booleans()):
        out["oom_group"] = draw(st.booleans())
    return out


_CPU_LISTS = ["big", "little", "all", "0", "7", "0-3", "4-7", "0-7", "0-3,6", "4-5,7", "0,2,4,6",
              "8", "0-8191", "8191", "3-1"]  # fmt: skip


@st.composite
def _cpu_section(draw: st.DrawFn) -> dict[str, object]:
    out: dict[str, object] = {}
    if draw(st.booleans()):
        if draw(st.booleans()):
            out["cpus"] = draw(st.sampled_from(_CPU_LISTS))
        else:  # a generated list of CPUs 0..7 (rk3588 has 8)
            cpus = sorted(draw(st.sets(st.integers(0, 7), min_size=1, max_size=8)))
            out["cpus"] = ",".join(map(str, cpus))
    if draw(st.booleans()):
        out["weight"] = draw(st.one_of(st.integers(1, 10000), st.sampled_from([1, 100, 10000])))
    if draw(st.booleans()):
        # 1% is the kernel's 1 ms quota minimum; 17592186044% its max_cfs_runtime
        out["max"] = draw(
            st.one_of(
                st.sampled_from(["max", "1%", "1.0%", "17592186044%", "17592186045%", "0.99%"]),
                st.integers(1, 800).map(lambda n: f"{n}%"),
            )
        )
    return out


_NAME = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True)
_ACCOUNT = st.sampled_from(["root", "llm", "nobody", "_svc", "a" * 32, "a" * 33, "x$", "ünï"])
_ENV_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)


@st.composite
def _process_section(draw: st.DrawFn) -> dict[str, object]:
    out: dict[str, object] = {}
    if draw(st.booleans()):
        out["user"] = draw(_ACCOUNT)
    if _usually(draw, 30):
        out["group"] = draw(_ACCOUNT)
    if draw(st.booleans()):
        out["oom_score_adj"] = draw(
            st.one_of(st.integers(-1000, 1000), st.sampled_from([-1000, 1000]))
        )
    if draw(st.booleans()):
        out["nice"] = draw(st.integers(-20, 19))
    if draw(st.booleans()):
        out["memlock"] = draw(st.one_of(st.sampled_from(["model", "unlimited"]), _SIZE_TEXT))
    if _usually(draw, 30):
        out["env"] = draw(st.dictionaries(_ENV_NAME, st.text(max_size=8), max_size=3))
    if draw(st.booleans()):
        out["on_governor_exit"] = draw(st.sampled_from(["kill", "keep"]))
    if _usually(draw, 30):
        out["restart_max"] = draw(st.integers(0, 10))
    if _usually(draw, 30):
        out["restart_backoff"] = draw(_DURATION)
    return out


@st.composite
def _trigger(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 9))
    if kind <= 4:  # PSI: window 500ms..10s, stall <= window
        window_us = draw(st.sampled_from([500_000, 1_000_000, 2_000_000, 10_000_000]))
        window = draw(_duration(window_us, window_us))
        stall = draw(_duration(1, window_us))
        res = draw(st.sampled_from(["memory", "cpu", "io"]))
        full = draw(st.sampled_from(["some", "full"]))
        scope = "system " if draw(st.booleans()) or (res, full) == ("cpu", "full") else ""
        if scope and _usually(draw, 40):
            scope = "board "  # the QoS spelling of the board's own pressure
        return f"{scope}{res} {full} {stall}/{window}"
    if kind <= 6:
        num, unit = draw(st.integers(1, 9999)), draw(st.sampled_from(["K", "KB", "kB", "MiB", "M"]))
        return f"leak > {num}{unit}/s for {draw(_duration(10_000_000))}"
    if kind == 7:
        size = draw(_SIZE_TEXT)
        spelling = draw(st.sampled_from(["memavailable", "board available", "board  available"]))
        return f"{spelling} < {size}"
    if kind == 8 and draw(st.booleans()):
        return f"device memory > {draw(_SIZE_TEXT)}"
    return draw(st.sampled_from(["oom_kill", "oom_group_kill", "oom", "max", "high"]))


_TRIGGER = _trigger()
_SIGNALS = ["SIGUSR1", "USR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGKILL", "SIGRTMIN", "SIGSTOP"]
_SETTABLE = ["memory.min", "memory.low", "memory.high", "memory.max", "memory.swap.max",
             "cpu.weight", "cpu.max"]  # fmt: skip


@st.composite
def _action(draw: st.DrawFn) -> str:
    verb = draw(st.sampled_from(["log", "thaw", "kill", "restart", "signal", "reclaim", "set",
                                 "freeze", "exec", "shed"]))  # fmt: skip
    if verb == "signal":
        return f"signal {draw(st.sampled_from(_SIGNALS))}"
    if verb == "reclaim":
        return f"reclaim {draw(_SIZE_TEXT)}"
    if verb == "freeze":
        return f"freeze {draw(_DURATION)}"
    if verb == "exec":
        word = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)
        argv = draw(st.lists(word, min_size=1, max_size=3))
        return "exec /bin/echo " + " ".join(f"'{w}'" if "'" not in w else w for w in argv)
    if verb == "set":
        file = draw(st.sampled_from(_SETTABLE))
        if file == "cpu.weight":
            value = str(draw(st.integers(1, 10000)))
        elif file == "cpu.max":
            value = draw(st.sampled_from(["max", "1%", "350%", "17592186044%"]))
        elif draw(st.booleans()):
            value = draw(st.sampled_from(["+10%", "-10%", "-99.9%", "+1000%", "+0.01%"]))
        else:
            value = draw(st.one_of(st.just("max"), _SIZE_TEXT.map(str)))
        return f"set {file} {value}"
    return verb


_ACTION = _action()


@st.composite
def _pressure_rule(draw: st.DrawFn) -> dict[str, object]:
    rule: dict[str, object] = {"when": draw(_TRIGGER)}
    if draw(st.booleans()):
        rule["for"] = draw(_DURATION)
    rule["do"] = draw(st.lists(_ACTION, min_size=1, max_size=3))
    if draw(st.booleans()):
        rule["cooldown"] = draw(_DURATION)
    return rule


_RULE = _pressure_rule()
_SECTIONS: dict[str, st.SearchStrategy[Any]] = {
    "memory": _memory_section(),
    "cpu": _cpu_section(),
    "process": _process_section(),
    "io": st.fixed_dictionaries({"weight": st.integers(1, 10000)}),
    "pids": st.fixed_dictionaries(
        {"max": st.one_of(st.just("max"), st.integers(1, 4194304), st.just(4194304))}
    ),
    "engine": st.fixed_dictionaries(
        {},
        optional={
            "kind": st.sampled_from(["llama.cpp", "generic"]),
            "max_context_tokens": st.integers(1, 2**31),
            "threads": st.integers(1, 64),
        },
    ),
    "prefetch": st.fixed_dictionaries(
        {},
        optional={
            "mode": st.sampled_from(["none", "advise", "populate", "lock"]),
            "files": st.one_of(
                st.just("auto"), st.lists(st.sampled_from(["*.gguf", "/m/q.gguf"]), min_size=1)
            ),
        },
    ),
}
_SHED_STEPS = ["throttle", "freeze", "stop", "kill"]


@st.composite
def _qos_section(draw: st.DrawFn) -> dict[str, object]:
    out: dict[str, object] = {}
    if _usually(draw, 80):
        out["class"] = draw(st.sampled_from(["interactive", "standard", "background"]))
    if draw(st.booleans()):
        steps = draw(st.lists(st.sampled_from(_SHED_STEPS), max_size=4, unique=True))
        if _rarely(draw, 10):  # a step twice, or one no shed knows
            steps.append(draw(st.sampled_from([*_SHED_STEPS, "evict", "KILL", ""])))
        out["yield"] = steps
    return out


# the rk3588 fixture's lists: cpufreq kHz, devfreq Hz (tests/fixtures/hosts/rk3588/sys)
_CPU_KHZ = [408000, 600000, 816000, 1008000, 1200000, 1416000, 1608000, 1800000, 2016000, 2208000,
            2256000, 2304000, 2352000]  # fmt: skip
_DEV_HZ = [300_000_000, 528_000_000, 800_000_000, 1_000_000_000, 1_068_000_000, 2_112_000_000]
_CLOCK_GOVERNORS = ["performance", "powersave", "userspace", "schedutil", "ondemand",
                    "simple_ondemand", "rknpu_ondemand", "dmc_ondemand", "nope", "A"]  # fmt: skip


@st.composite
def _freq(draw: st.DrawFn, key: str) -> object:
    if _usually(draw, 30):
        return draw(st.sampled_from(["max", "min"]))
    raw = draw(st.sampled_from(_CPU_KHZ if key in ("big", "little") else _DEV_HZ))
    how = draw(st.integers(0, 9))
    if how <= 3:
        return raw  # in the list's own unit
    hz = raw * 1000 if key in ("big", "little") else raw
    if how <= 7:
        return f"{hz // 1_000_000}MHz" if hz % 1_000_000 == 0 else f"{hz}Hz"
    return draw(st.sampled_from([f"{hz / 1e9:g}GHz", "1.2345GHz", "0Hz", "7", "3.5GHz"]))


@st.composite
def _clocks_section(draw: st.DrawFn) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in draw(st.lists(st.sampled_from(["big", "little", "npu", "gpu", "dmc"]),
                             min_size=1, max_size=3, unique=True)):  # fmt: skip
        if draw(st.booleans()):
            out[key] = draw(st.sampled_from(_CLOCK_GOVERNORS[:7]))
            continue
        table: dict[str, object] = {}
        if draw(st.booleans()):
            table["governor"] = draw(st.sampled_from(_CLOCK_GOVERNORS))
        for bound in ("min", "max"):
            if draw(st.booleans()):
                table[bound] = draw(_freq(key))
        if _usually(draw, 20):
            table["governor"] = "userspace"
            table["freq"] = draw(_freq(key))
        out[key] = table
    return out


_SECTIONS["qos"] = _qos_section()
_SECTIONS["clocks"] = _clocks_section()
_SECTIONS["device"] = st.fixed_dictionaries(
    {},
    optional={
        "memory": st.one_of(st.just("model"), _SIZE_TEXT),
        "pool": st.sampled_from(["system", "cma"]),
    },
)
_SECTION_NAMES = st.lists(st.sampled_from(sorted(_SECTIONS)), max_size=7, unique=True)
_SLICES = ["governor.slice", "llm.slice", "a-b.slice", "gov_1:x.slice", "x" * 249 + ".slice"]


@st.composite
def _policy_doc(draw: st.DrawFn) -> dict[str, Any]:
    """A policy as a dict (what the TOML will hold): valid structure and values near limits."""
    doc: dict[str, Any] = {"name": draw(_NAME)}
    if _usually(draw, 30):
        doc["description"] = draw(st.text(max_size=20))
    if _usually(draw, 20):
        doc["slice"] = draw(st.sampled_from(_SLICES))
    for name in draw(_SECTION_NAMES):
        doc[name] = draw(_SECTIONS[name])
    rules = draw(st.lists(_RULE, max_size=4))
    if rules:
        doc["pressure"] = rules
    return doc


_UNKNOWN_KEYS = ["colour", "memory_max", "Max", "max ", "oom_kill_disable", "swap", "for_",
                 "ünï", ""]  # fmt: skip


@st.composite
def _hostile(draw: st.DrawFn, doc: dict[str, Any]) -> dict[str, Any]:
    """One hostile change in a few examples: an unknown key, a wrong-typed or out-of-range
    value, a nested table, a bad name, nesting past the loader's limit."""
    what = 99 - draw(st.integers(0, 99))  # 99: the simplest draw, no change
    tables = [k for k, v in doc.items() if isinstance(v, dict)]
    if what < 5:  # an unknown key, at the top or in a section
        in_section = bool(tables) and draw(st.booleans())
        where = doc[draw(st.sampled_from(tables))] if in_section else doc
        where[draw(st.sampled_from(_UNKNOWN_KEYS))] = draw(_VALUES)
    elif what < 12:  # a hostile value where a good one was
        if tables:
            table = doc[draw(st.sampled_from(tables))]
            if table:
                table[draw(st.sampled_from(sorted(table)))] = draw(_VALUES)
        elif doc.get("pressure"):
            doc["pressure"][0][draw(st.sampled_from(sorted(doc["pressure"][0])))] = draw(_VALUES)
    elif what < 14:  # a table where a value belongs
        if tables:
            table = doc[draw(st.sampled_from(tables))]
            table[draw(st.sampled_from(sorted(table) or ["x"]))] = {"x": draw(_VALUES)}
    elif what < 17:  # a name no cgroup or unit may carry
        doc["name"] = draw(st.sampled_from(["A", "a" * 80, "n\x00", "", "-x", "a/b", ".."]))
    elif what < 19:  # nesting deeper than the loader's limit (8), or just at it
        depth = draw(st.integers(6, 12))
        node: dict[str, Any] = {}
        doc["memory" if draw(st.booleans()) else "deep"] = node
        for _ in range(depth):
            node["n"] = {}
            node = node["n"]
    return doc


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml(key)


def _toml(value: object) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(str(value), repr(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    text = str(value)
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}"
                         for c in text) + '"'  # fmt: skip


def _dump(doc: dict[str, Any]) -> str:
    """TOML text of a policy dict: scalars first, then [tables], then [[pressure]]."""
    lines = [f"{_key(k)} = {_toml(v)}" for k, v in doc.items() if not isinstance(v, dict)
             and k != "pressure"]  # fmt: skip
    if isinstance(doc.get("pressure"), dict):
        lines.append(f"pressure = {_toml(doc['pressure'])}")
    for name, table in doc.items():
        if isinstance(table, dict):
            lines.append(f"[{_key(name)}]")
            lines += [f"{_key(k)} = {_toml(v)}" for k, v in table.items()]
    if isinstance(doc.get("pressure"), list):
        for rule in doc["pressure"]:
            if isinstance(rule, dict):
                lines.append("[[pressure]]")
                lines += [f"{_key(k)} = {_toml(v)}" for k, v in rule.items()]
    return "\n".join(lines) + "\n"


@st.composite
def _policy_files(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    """(text, chain): a policy and, in some examples, the `extends` chain it is split into:
    [(file name, TOML text)], the first one loaded. Keys are spread over the chain so that the
    merged policy is the generated one; a few chains are hostile (cycle, missing, too deep)."""
    doc = draw(_hostile(draw(_policy_doc())))
    text = _dump(doc)
    if _usually(draw, 60):
        return text, []
    depth = draw(st.integers(1, 3))
    files: list[dict[str, Any]] = [{"name": doc.get("name")}] + [{} for _ in range(depth)]
    for key, value in doc.items():
        if key == "name":
            continue
        if isinstance(value, dict):
            for k, v in value.items():
                files[draw(st.integers(0, depth))].setdefault(key, {})[k] = v
        else:
            files[draw(st.integers(0, depth))][key] = value
    names = [f"p{i}.toml" for i in range(depth + 1)]
    refs: list[object] = [*names[1:], None]
    trouble = 99 - draw(st.integers(0, 99))  # 99: the simplest draw, a good chain
    if trouble < 3:
        refs[-1] = names[0]  # a cycle back to the first
    elif trouble < 6:
        refs[draw(st.integers(0, depth))] = draw(
            st.sampled_from(["missing.toml", "../nope.toml", "x\x00y.toml", 7, ".", ""])
        )
    elif trouble < 8:  # deeper than the loader's 8
        refs = [f"p{i}.toml" for i in range(1, 10)] + [None]
        names = [f"p{i}.toml" for i in range(10)]
        files += [{} for _ in range(10 - len(files))]
    chain = []
    for i, name in enumerate(names):
        head = {"extends": refs[i]} if refs[i] is not None else {}
        chain.append((name, _dump({**head, **files[i]})))
    return text, chain


@st.composite
def _policy_case(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]], str, int | None]:
    text, chain = draw(_policy_files())
    host = draw(st.sampled_from(HOST_NAMES))
    model = draw(st.one_of(st.none(), st.integers(1, 2**40), st.just(SIZE_MAX_BYTES)))
    return text, chain, host, model


def test_any_policy_loads_and_compiles_or_gives_one_governor_error(
    tmp_path: Path, report_reach: Callable[[str], None]
) -> None:
    reach: Reach = collections.Counter()

    @settings(max_examples=400)
    @given(_policy_case())
    def run(case: tuple[str, list[tuple[str, str]], str, int | None]) -> None:
        text, chain, host, model = case
        reach["examples"] += 1
        try:
            if chain:
                for old in tmp_path.iterdir():
                    old.unlink()
                for name, body in chain:
                    (tmp_path / name).write_text(body)
                policy = load(tmp_path / chain[0][0], euid=0)
            else:
                policy = load_text(text, source="fuzz.toml")
        except GovernorError as err:
            _check_error(err, (65, 66))
            return
        reach["loader ok"] += 1
        try:
            plan = compile_plan(
                policy, _host(host), workload=Workload(model_bytes=model), source="fuzz.toml"
            )
        except GovernorError as err:
            _check_error(err, (2, 65, 66, 69, 71, 77))
            return
        reach["compiler ok"] += 1
        assert plan_table(plan)
        assert type(plan).from_json(plan.to_json()) == plan

    run()
    report_reach(_summary("policies", reach, ("loader ok", "compiler ok")))
    assert _fraction(reach, "loader ok") >= 0.5, "most policies must reach the compiler"
    assert _fraction(reach, "compiler ok") >= 0.3, "many policies must compile"


# ---------------------------------------------------------------- the board's sections

_BOARD_FEATURES = ("qos", "clocks", "device", "shed", "board condition")
_BOARD_WHEN = st.one_of(
    st.sampled_from(
        [
            "board memory some 100ms/1s",
            "board memory full 500ms/2s",
            "board cpu some 200ms/2s",
            "board io some 1s/10s",
        ]
    ),
    _SIZE_TEXT.map(lambda size: f"board available < {size}"),
    _SIZE_TEXT.map(lambda size: f"device memory > {size}"),
)


@st.composite
def _board_case(draw: st.DrawFn) -> tuple[str, frozenset[str], str, int | None]:
    """A policy with this wave's sections ([qos], [clocks], [device]) and a rule that sheds on
    a board condition, each in most examples, on top of _policy_doc; then _hostile."""
    doc = draw(_policy_doc())
    features: set[str] = set()
    for name in ("qos", "clocks", "device"):
        if _usually(draw, 70):
            doc[name] = draw(_SECTIONS[name])
            features.add(name)
    if _usually(draw, 70):
        board = _usually(draw, 70)
        rule: dict[str, object] = {"when": draw(_BOARD_WHEN if board else _TRIGGER)}
        rule["do"] = draw(st.sampled_from([["shed"], ["log", "shed"], ["shed", "log"]]))
        if draw(st.booleans()):
            rule["cooldown"] = draw(_DURATION)
        doc["pressure"] = [rule, *doc.get("pressure", [])][:4]
        features |= {"shed", "board condition"} if board else {"shed"}
    if _usually(draw, 30):
        doc.setdefault("engine", {})["kind"] = draw(st.sampled_from(["rkllm", "llama.cpp"]))
    doc = draw(_hostile(doc))
    host = draw(st.sampled_from(HOST_NAMES))
    model = draw(st.one_of(st.none(), st.integers(1, 2**34)))
    return _dump(doc), frozenset(features), host, model


def test_any_board_policy_compiles_or_gives_one_governor_error(
    report_reach: Callable[[str], None],
) -> None:
    """[qos] (class, yield), [clocks] (governors and frequencies of the rk3588 fixture's lists,
    in every spelling), [device] and `shed` on board conditions (board PSI, `board available`,
    `device memory`): loaded and compiled, or one governor error."""
    reach: Reach = collections.Counter()

    @settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
    @given(_board_case())
    def run(case: tuple[str, frozenset[str], str, int | None]) -> None:
        text, features, host, model = case
        reach["examples"] += 1
        for f in features:
            reach[f"{f} drawn"] += 1
        try:
            policy = load_text(text, source="fuzz.toml")
        except GovernorError as err:
            _check_error(err, (65, 66))
            return
        reach["loader ok"] += 1
        try:
            plan = compile_plan(
                policy, _host(host), workload=Workload(model_bytes=model), source="fuzz.toml"
            )
        except GovernorError as err:
            _check_error(err, (2, 65, 66, 69, 71, 77))
            return
        reach["compiler ok"] += 1
        for f in features:
            reach[f"{f} compiled"] += 1
        assert plan_table(plan)
        assert type(plan).from_json(plan.to_json()) == plan

    run()
    stages = ("loader ok", "compiler ok", *(f"{f} compiled" for f in _BOARD_FEATURES))
    report_reach(_summary("board sections", reach, stages))
    assert _fraction(reach, "loader ok") >= 0.5, "most board policies must reach the compiler"
    assert _fraction(reach, "compiler ok") >= 0.2, "many board policies must compile"
    for f in _BOARD_FEATURES:
        assert reach[f"{f} compiled"] >= reach["examples"] // 20, f"{f}: too few compiled"


# ---------------------------------------------------------------- engine argv

_ARGV_WORDS = st.one_of(
    st.sampled_from(["-m", "--model", "-c", "--ctx-size", "-t", "-b", "-ub", "-ctk", "-ctv",
                     "-nr", "--no-repack", "--mlock", "--no-mmap", "-ngl", "--", "-fa", "-lm",
                     "--ctx-size=", "--model=m.gguf", "-p"]),
    st.text(max_size=12),
    _NUMBERS.map(str),
    st.sampled_from(["x-00001-of-00000.gguf", "m-00002-of-00001.gguf", "m-00001-of-00003.gguf",
                     "9" * 400, "-5", "q.gguf", str(2**31 - 1), str(2**31), "0"]),
)  # fmt: skip


def test_any_engine_argv_parses_or_gives_an_argv_error(
    report_reach: Callable[[str], None],
) -> None:
    reach: Reach = collections.Counter()

    @settings(max_examples=500)
    @given(st.lists(_ARGV_WORDS, max_size=12), st.one_of(st.none(), st.integers(1, 8192)))
    def run(words: list[str], cap: int | None) -> None:
        reach["examples"] += 1
        argv = ["llama-cli", *words]
        try:
            parse_llama_argv(argv)
        except EngineArgvError as err:
            assert len(str(err)) < 300 and "\n" not in str(err), str(err)
        else:
            reach["parsed"] += 1
        # what a user sees: the preflight of launch/check turns it into a PolicyError (65)
        try:
            engine_args("llama.cpp", cap, argv)
        except GovernorError as err:
            _check_error(err, (65,))
            return
        reach["preflight ok"] += 1

    run()
    report_reach(_summary("engine argv", reach, ("parsed", "preflight ok")))
    assert _fraction(reach, "parsed") >= 0.3, "many argvs must be read to the end"


# llama-server's own options and the values its checks turn on: ports, slot and cache counts,
# addresses, what Python's int() reads and llama.cpp's std::stoi does not
_SERVER_OPTS = ["-np", "--parallel", "-cram", "--cache-ram", "-ctxcp", "--ctx-checkpoints",
                "--swa-checkpoints", "--host", "--port", "-kvu", "--kv-unified", "-no-kvu",
                "--kv-unified-per-slot", "-b", "-ub", "-t", "-c"]  # fmt: skip
_SERVER_VALUES = ["0", "1", "-1", "-2", "4", "8080", "65535", "65536", "99999", "+0", "00",
                  " 7", "1_0", "\u0661\u0662", "\u00b2", "\uff18", str(2**31 - 1), str(2**31),
                  "9" * 5000, "", ",", "0.0.0.0", "::", "a,b", "x.sock", "m.gguf"]  # fmt: skip
_SERVER_WORDS = st.one_of(
    st.sampled_from(_SERVER_OPTS),
    st.sampled_from(_SERVER_VALUES),
    st.tuples(
        st.sampled_from(["--port=", "--host=", "--parallel=", "--cache-ram="]),
        st.sampled_from(_SERVER_VALUES),
    ).map("".join),
    _ARGV_WORDS,
)
# an option with a value the server takes: most of an argv, so that the hostile word in it
# is what decides
_SERVER_PAIRS = st.sampled_from(
    [["-np", "2"], ["--parallel", "-1"], ["-cram", "256"], ["--cache-ram", "0"], ["-kvu"],
     ["--ctx-checkpoints", "4"], ["--host", "0.0.0.0"], ["--host=::"], ["--port", "8080"],
     ["--port=65535"], ["-c", "2048"], ["-t", "4"], ["-b", "512"], ["-ub", "128"], ["-no-kvu"],
     ["-p", "hi"], ["-n", "16"]]
)  # fmt: skip
_SERVER_ENV = st.dictionaries(
    st.sampled_from(["LLAMA_ARG_PORT", "LLAMA_ARG_HOST", "LLAMA_ARG_N_PARALLEL",
                     "LLAMA_ARG_CACHE_RAM", "LLAMA_ARG_KV_UNIFIED", "LLAMA_ARG_CTX_SIZE"]),
    st.sampled_from(_SERVER_VALUES[:16]),
    max_size=3,
)  # fmt: skip


def test_any_llama_server_argv_is_read_or_refused_in_one_line(
    report_reach: Callable[[str], None],
) -> None:
    """llama-server's argv and LLAMA_ARG_* environment: read (a port is a TCP port then), or
    refused with one line naming the option, through the preflight launch and check run."""
    reach: Reach = collections.Counter()

    @settings(max_examples=600)
    @given(
        st.tuples(
            st.lists(_SERVER_PAIRS, max_size=5).map(lambda ps: [w for p in ps for w in p]),
            st.lists(_SERVER_WORDS, max_size=2),
        ),
        _SERVER_ENV,
        st.one_of(st.none(), st.integers(0, 8192)),
    )
    def run(parts: tuple[list[str], list[str]], env: dict[str, str], cap: int | None) -> None:
        reach["examples"] += 1
        argv = ["/opt/llama/llama-server", "-m", "m.gguf", *parts[0], *parts[1]]
        try:
            args = engine_args("llama.cpp", 4096, argv, max_cache_ram=cap, env=env)
        except GovernorError as err:
            _check_error(err, (65,))
            assert len(str(err)) < 300, str(err)
            return
        assert args is not None and args.server
        reach["read"] += 1
        if args.port is not None:
            assert 1 <= args.port <= 65535, args.port
            reach["with a port"] += 1
        if args.parallel is not None:
            assert args.parallel == -1 or args.parallel >= 1, args.parallel
            reach["with slots"] += 1

    run()
    report_reach(_summary("llama-server argv", reach, ("read", "with a port", "with slots")))
    assert _fraction(reach, "read") >= 0.2, "many server argvs must be read"
    assert reach["with a port"] >= reach["examples"] // 20
    assert reach["with slots"] >= reach["examples"] // 20


_RKLLM_COUNTS = st.one_of(
    st.integers(1, 4096).map(str),
    st.integers(1, 4096).map(str),
    st.integers(1, 4096).map(str),
    st.sampled_from(
        [
            "0",
            "-1",
            "+5",
            " 5",
            "1_0",
            "\u0661\u0662",
            "\u00b2",
            "\uff18",
            str(2**31 - 1),
            str(2**31),
            "9" * 5000,
            "",
            "-p",
            "x",
        ]
    ),
)


def test_any_rkllm_argv_is_read_or_refused_in_one_line(
    tmp_path: Path, report_reach: Callable[[str], None]
) -> None:
    """llm_demo MODEL MAX_NEW_TOKENS MAX_CONTEXT_LEN with counts in every spelling: read (a
    count is then a positive int32), or one governor error (65; 66 for a missing model)."""
    from governor.engines.rkllm import check_rkllm

    model = tmp_path / "m.rkllm"
    model.write_bytes(b"rkllm weights")
    reach: Reach = collections.Counter()

    @settings(max_examples=400)
    @given(
        st.sampled_from([str(model), str(model), str(model), str(tmp_path / "missing.rkllm")]),
        st.lists(_RKLLM_COUNTS, max_size=3),
        st.one_of(st.none(), st.integers(1, 8192)),
    )
    def run(path: str, counts: list[str], cap: int | None) -> None:
        reach["examples"] += 1
        try:
            found, size = check_rkllm(["llm_demo", path, *counts], cap)
        except GovernorError as err:
            _check_error(err, (65, 66))
            assert len(str(err)) < 300, str(err)
            return
        assert found == model and size == model.stat().st_size
        reach["read"] += 1

    run()
    report_reach(_summary("rkllm argv", reach, ("read",)))
    assert _fraction(reach, "read") >= 0.2, "many rkllm argvs must be read"


# ---------------------------------------------------------------- GGUF headers

_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_FMT = {_U8: "<B", _I8: "<b", _U16: "<H", _I16: "<h", _U32: "<I", _I32: "<i", _F32: "<f",
        _BOOL: "<?", _U64: "<Q", _I64: "<q", _F64: "<d"}  # fmt: skip
_INT_TYPES = (_U8, _U16, _U32, _U64, _I8, _I16, _I32, _I64)


def _gstr(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _int_range(vtype: int) -> tuple[int, int]:
    bits = struct.calcsize(_FMT[vtype]) * 8
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if vtype in (_I8, _I16, _I32, _I64) else (
        0, (1 << bits) - 1)  # fmt: skip


@st.composite
def _gint(draw: st.DrawFn, lo: int = 1, hi: int = 4096, edge: bool = False) -> tuple[int, bytes]:
    """An integer in [lo, hi] in any integer type that holds it; with ``edge``, the type's
    bounds, 0 or -1 instead."""
    vtype = draw(st.sampled_from([t for t in _INT_TYPES if _int_range(t)[1] >= lo]))
    tlo, thi = _int_range(vtype)
    if edge:
        n = draw(st.sampled_from([tlo, thi, 0, -1 if tlo else 0]))
    else:
        n = draw(st.integers(max(lo, tlo), min(hi, thi)))
    return vtype, struct.pack(_FMT[vtype], n)


@st.composite
def _gvalue(draw: st.DrawFn, depth: int = 0, max_depth: int = 3) -> tuple[int, bytes]:
    """Any GGUF value with a matching payload; arrays of scalars, strings and arrays."""
    kinds = [*_FMT, _STR, _ARR] if depth < max_depth else [*_FMT, _STR]
    vtype = draw(st.sampled_from(kinds))
    if vtype in _FMT:
        if vtype in (_F32, _F64):
            return vtype, struct.pack(
                _FMT[vtype], draw(st.floats(width=32 if vtype == _F32 else 64))
            )
        if vtype == _BOOL:
            return vtype, struct.pack("<?", draw(st.booleans()))
        lo, hi = _int_range(vtype)
        return vtype, struct.pack(_FMT[vtype], draw(st.integers(lo, hi)))
    if vtype == _STR:
        return vtype, _gstr(draw(st.binary(max_size=12)))
    items = [draw(_gvalue(depth + 1, max_depth)) for _ in range(draw(st.integers(0, 3)))]
    itype = items[0][0] if items else draw(st.sampled_from([*_FMT, _STR]))
    items = [i for i in items if i[0] == itype]
    return _ARR, struct.pack("<IQ", itype, len(items)) + b"".join(p for _, p in items)


# one flaw in about a fifth of the files (none in the simplest draw); the rest are well formed
_FLAWS = ("qtype", "file_type", "alignment", "n_dims", "missing key", "edge value", "odd row",
          "version", "n_tensors", "cut", "no arch", "nested")  # fmt: skip


@st.composite
def _gguf_file(draw: st.DrawFn, qtypes: list[tuple[int, int, int]],
               file_types: list[int]) -> tuple[bytes, int]:  # fmt: skip
    """(header bytes, file length): a GGUF v2/v3 header with the keys an estimate needs in
    integer types of every width, other keys of every type (arrays of arrays included), a
    vocabulary, tensor infos with plausible dims, types and aligned offsets, and a file as long
    as its tensor data; about a fifth of the files carry one flaw of _FLAWS."""
    flaw = None if _usually(draw, 80) else draw(st.sampled_from(_FLAWS))
    arch = "" if flaw == "no arch" else draw(st.sampled_from(["llama", "qwen2", "gemma3", "ünï",
                                                              "l\x00a", "a" * 300]))  # fmt: skip
    kvs: list[tuple[bytes, int, bytes]] = [(b"general.architecture", _STR, _gstr(arch.encode()))]
    need = {"block_count": 256, "embedding_length": 1 << 16, "attention.head_count": 256,
            "context_length": 1 << 20}  # fmt: skip
    opt = {"attention.head_count_kv": 256, "attention.key_length": 1024,
           "attention.value_length": 1024, "vocab_size": 1 << 18}  # fmt: skip
    missing = draw(st.sampled_from(sorted(need))) if flaw == "missing key" else None
    edge = draw(st.sampled_from(sorted(need | opt))) if flaw == "edge value" else None
    for key, hi in {**need, **opt}.items():
        if key != missing and (key in need or draw(st.booleans())):
            kvs.append(((f"{arch}.{key}").encode(), *draw(_gint(key in need, hi, key == edge))))
    align = 32
    if flaw == "alignment":
        align = draw(st.sampled_from([0, 3, 48, 2**32 - 1]))
        kvs.append((b"general.alignment", _U32, struct.pack("<I", align)))
    elif draw(st.booleans()):
        align = draw(st.sampled_from([32, 1, 2, 8, 64, 4096]))
        vtype, _ = draw(_gint(align, align))
        kvs.append((b"general.alignment", vtype, struct.pack(_FMT[vtype], align)))
    if flaw == "file_type" or draw(st.booleans()):
        ftype = draw(st.integers(0, 1000) if flaw == "file_type" else st.sampled_from(file_types))
        assume(flaw != "file_type" or ftype not in file_types)
        kvs.append((b"general.file_type", _U32, struct.pack("<I", ftype)))
    if draw(st.booleans()):
        tokens = draw(st.lists(st.binary(max_size=6), max_size=20))
        kvs.append((b"tokenizer.ggml.tokens", _ARR,
                    struct.pack("<IQ", _STR, len(tokens)) + b"".join(map(_gstr, tokens))))  # fmt: skip
    for _ in range(draw(st.integers(0, 4))):
        kvs.append((b"x." + draw(st.binary(max_size=8)), *draw(_gvalue())))
    if flaw == "nested":  # arrays of arrays deeper than the reader's 4 levels
        payload = struct.pack("<IQ", _U8, 0)
        for _ in range(draw(st.integers(5, 40))):
            payload = struct.pack("<IQ", _ARR, 1) + payload
        kvs.append((b"x.nested", _ARR, payload))
    kvs = [kvs[0], *draw(st.permutations(kvs[1:]))]

    tensors: list[bytes] = []
    offset, end = 0, 0
    n_tensors = draw(st.integers(1 if flaw in ("qtype", "n_dims", "odd row") else 0, 6))
    bad = draw(st.integers(0, n_tensors - 1)) if n_tensors else -1  # the flawed tensor
    for i in range(n_tensors):
        qtype, block, type_size = draw(st.sampled_from(qtypes))
        if flaw == "qtype" and i == bad:
            qtype = draw(st.sampled_from([4, 5, 31, 200, 2**32 - 1]))  # removed or never used
        n_dims = draw(st.sampled_from([0, 5, 2**32 - 1]) if flaw == "n_dims" and i == bad
                      else st.integers(1, 4))  # fmt: skip
        dims = [block * draw(st.integers(1, 4))] + [draw(st.integers(1, 8)) for _ in range(3)]
        dims = dims[: min(n_dims, 5)]
        if flaw == "odd row" and i == bad and block > 1:
            dims[0] += 1  # a row that is not a whole number of blocks
        n_bytes = 1
        for d in dims:
            n_bytes *= d
        n_bytes = n_bytes // block * type_size
        name = draw(st.sampled_from([b"token_embd.weight", b"output.weight", b""])) if i == 0 else (
            f"blk.{i}.attn_q.weight".encode())  # fmt: skip
        tensors.append(_gstr(name) + struct.pack("<I", n_dims) + b"".join(
            struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", qtype, offset))  # fmt: skip
        end = offset + n_bytes
        offset = -(-end // max(align, 1)) * max(align, 1)
    version = draw(st.sampled_from([1, 0, 2**32 - 1])) if flaw == "version" else (
        draw(st.sampled_from([3, 2])))  # fmt: skip
    count = draw(st.sampled_from([1 << 24, 2**64 - 1])) if flaw == "n_tensors" else len(tensors)
    header = b"GGUF" + struct.pack("<IQQ", version, count, len(kvs))
    header += b"".join(_gstr(k) + struct.pack("<I", t) + p for k, t, p in kvs) + b"".join(tensors)
    length = -(-len(header) // max(align, 1)) * max(align, 1) + end
    if flaw == "cut":  # inside the tensor data, or inside the header
        length = draw(st.integers(0, max(0, length - 1)))
    return header, length


def test_any_gguf_header_reads_or_gives_a_policy_error(
    report_reach: Callable[[str], None],
) -> None:
    gguf = pytest.importorskip("gguf")
    from governor.engines.estimate import estimate, render
    from governor.engines.gguf import read_gguf
    from governor.engines.settings import Settings

    qtypes = [(q.value, *gguf.GGML_QUANT_SIZES[q]) for q in gguf.GGMLQuantizationType]
    file_types = [t.value for t in gguf.LlamaFileType]
    reach: Reach = collections.Counter()
    fd, name = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    path = Path(name)

    @settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
    @given(
        _gguf_file(qtypes, file_types),
        st.one_of(st.none(), st.integers(1, 1 << 20)),
        st.one_of(st.none(), st.integers(0, 1 << 34)),
    )
    def run(case: tuple[bytes, int], ctx: int | None, budget: int | None) -> None:
        header, length = case
        reach["examples"] += 1
        with path.open("wb") as f:
            f.write(header[:length])
            f.truncate(length)  # the tensor data: a hole of the right length
        try:
            info = read_gguf(path)
        except GovernorError as err:
            _check_error(err, (65, 66, 69))
            return
        reach["header parsed"] += 1
        est = estimate(
            info, Settings(ctx=ctx or info.n_ctx_train), family="arm-dotprod", budget=budget
        )
        assert render(est)
        reach["estimated"] += 1

    try:
        run()
    finally:
        path.unlink()
    report_reach(_summary("GGUF headers", reach, ("header parsed", "estimated")))
    assert _fraction(reach, "header parsed") >= 0.5, "most GGUF headers must parse"
