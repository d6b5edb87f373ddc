"""Bad input, generated: whatever a policy, a value, a GGUF header or an engine argv holds, the
governor answers with its own error (the documented exit code, one line, a hint) and never a
traceback. Bounded example counts keep the host tier fast; the shapes come from the hostile
inputs of issue 14 (huge numbers, NUL, control characters, deep nesting, wrong types).

Needs: the host fixtures; the GGUF cases need the `gguf` package.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor.engines.llama import EngineArgvError, parse_llama_argv
from governor.errors import GovernorError, PolicyError
from governor.plan.compiler import compile_plan
from governor.plan.host import probe
from governor.policy.loader import load_text

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
RK3588 = probe(HOSTS / "rk3588")

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
_VALUES = st.one_of(_NUMBERS, _TEXTS, st.booleans(), st.floats(allow_nan=True), st.none())
_KEYS = {
    "memory": ["min", "low", "high", "max", "swap_max", "oom_group"],
    "cpu": ["cpus", "weight", "max"],
    "io": ["weight"],
    "pids": ["max"],
    "process": ["user", "group", "oom_score_adj", "nice", "memlock", "on_governor_exit"],
    "engine": ["kind", "max_context_tokens", "threads"],
    "prefetch": ["mode", "files"],
}


def _toml(value: object) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(str(value), repr(value))
    text = str(value)
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}"
                         for c in text) + '"'  # fmt: skip


@st.composite
def _policies(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(["x", "ok-1", "A", "a" * 80, "n\x00"]))
    lines = [f"name = {_toml(name)}"]
    for section in draw(st.lists(st.sampled_from(sorted(_KEYS)), max_size=4, unique=True)):
        lines.append(f"[{section}]")
        for key in draw(st.lists(st.sampled_from(_KEYS[section]), max_size=3, unique=True)):
            lines.append(f"{key} = {_toml(draw(_VALUES))}")
    for _ in range(draw(st.integers(0, 2))):
        lines += [
            "[[pressure]]",
            f"when = {_toml(draw(_TEXTS))}",
            f"do = [{_toml(draw(_TEXTS))}]",
            f"cooldown = {_toml(draw(_TEXTS))}",
        ]
    return "\n".join(lines) + "\n"


@settings(max_examples=400, deadline=None)
@given(_policies())
def test_any_policy_loads_and_compiles_or_gives_one_governor_error(text: str) -> None:
    try:
        policy = load_text(text, source="fuzz.toml")
    except PolicyError as err:
        assert err.exit_code == 65
        assert "\n" not in str(err) and err.hint
        return
    try:
        compile_plan(policy, RK3588)
    except GovernorError as err:
        assert err.exit_code in (2, 65, 66, 69, 71, 77)
        assert "\n" not in str(err) and err.hint


_ARGV_WORDS = st.one_of(
    st.sampled_from(["-m", "--model", "-c", "--ctx-size", "-t", "-b", "-ub", "-ctk", "-ctv",
                     "-nr", "--no-repack", "--mlock", "--no-mmap", "-ngl", "--", "-fa"]),
    st.text(max_size=12),
    _NUMBERS.map(str),
    st.sampled_from(["x-00001-of-00000.gguf", "m-00002-of-00001.gguf", "9" * 400, "-5", "q.gguf"]),
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(_ARGV_WORDS, max_size=12))
def test_any_engine_argv_parses_or_gives_an_argv_error(words: list[str]) -> None:
    try:
        parse_llama_argv(["llama-cli", *words])
    except EngineArgvError as err:
        assert len(str(err)) < 300


def _header(n_tensors: int, kvs: list[tuple[str, int, bytes]]) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kvs))
    for key, vtype, payload in kvs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + payload
    return out


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.integers(0, 2**64 - 1),
    st.lists(
        st.tuples(st.text(max_size=8), st.integers(0, 15), st.binary(max_size=24)), max_size=4
    ),
    st.binary(max_size=64),
)
def test_any_gguf_header_reads_or_gives_a_policy_error(
    n_tensors: int, kvs: list[tuple[str, int, bytes]], tail: bytes
) -> None:
    pytest.importorskip("gguf")
    from governor.engines.gguf import read_gguf

    try:
        data = _header(n_tensors, kvs) + tail
    except (struct.error, UnicodeEncodeError):
        return
    fd, name = tempfile.mkstemp(suffix=".gguf")
    try:
        os.write(fd, data)
        os.close(fd)
        try:
            read_gguf(Path(name))
        except GovernorError as err:
            assert err.exit_code in (65, 66, 69)
            assert "\n" not in str(err)
    finally:
        os.unlink(name)
