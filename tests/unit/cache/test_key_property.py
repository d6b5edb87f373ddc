"""The plan cache's key and a fresh compile agree on every generated engine argv.

A launch whose key (governor/cache/plans.py entry_name: the words of governor/plan/llama_args.py
compile_words, the LLAMA_ARG_* variables of compile_env) names a stored entry runs that entry's
plan without compiling. So two argvs with one key must compile alike: both refused with the same
error, or both accepted with the same plan. The key is a hash of the kept words, so the argvs
of one key all keep the SAME words c = compile_words(a); the property is checked as

    key(a) is None (the launch compiles)  or  key(c) == key(a) and compile(c) == compile(a),

which, for every a and b of one key, gives compile(a) == compile(c) == compile(b). "compile" is
what a launch's compile reads from the argv, for each engine kind a policy can name (llama.cpp,
rkllm, generic): preflight.engine_args (+ model_bytes) and rkllm.check_rkllm, with the --host/
--port the key leaves out masked (launch reads them at every start); and, on fewer examples, the
whole compile (api/host.py preflight_engine: policy, probe of the rk3588 fixture, plan, preflight)
compared as plan JSON, warnings, estimate and prefetch. A refusal is compared by its exit code:
it is never stored, so only "refused or not" reaches the next launch.

The generator draws mostly from the words both readers know (every option of llama_args's tables,
--, inline --opt=value, values a port/count check refuses, Unicode digits, huge numbers), so
many argvs are accepted and many share a key with another; the reach line says how many.

Needs: the host fixture trees (tests/fixtures/hosts). Replay: tests/unit/conftest.py profiles.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor.api.host import HostOptions, preflight_engine
from governor.cache import plans
from governor.engines.preflight import engine_args, model_bytes
from governor.engines.rkllm import check_rkllm
from governor.errors import GovernorError
from governor.plan import llama_args as argkey

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
KINDS = ("llama.cpp", "rkllm", "generic")
PROGRAMS = ("/opt/llama/llama-server", "llama-completion", "llm_demo")
# values that reach each check: ports in and out of range, counts at their bounds, what Python's
# int() takes and std::stoi does not (Unicode digits, "1_0"), numbers past int32 and past 4300
# digits, empty and comma-only addresses
VALUES = (
    "m.gguf", "m.rkllm", "missing.gguf", "0", "1", "-1", "-2", "2", "64", "512", "2048", "4096",
    "8080", "65535", "65536", "99999", "+80", " 80", "0x50", "1_0", "\u0661\u0662", "\u00b2",
    str(2**31 - 1), str(2**31), "9" * 5000, "", ",", " , ", "0.0.0.0", "::", "a,b", "x.sock",
    "q8_0", "f16", "mmap", "-c 9", "--port",
)  # fmt: skip
FLAGS = ("-nr", "--no-repack", "--mlock", "--no-mmap", "-kvu", "-no-kvu", "--swa-full", "-fa")
INLINE = ("--port=", "--host=", "--ctx-size=", "--model=", "--cache-ram=", "--prompt=")
WORD = st.one_of(
    st.sampled_from(sorted(argkey.VALUE_OPTS)),
    st.sampled_from(sorted(argkey.IGNORED_OPTS | {"--host", "--port"})),
    st.sampled_from(VALUES),
    st.sampled_from(FLAGS),
    st.tuples(st.sampled_from(INLINE), st.sampled_from(VALUES)).map("".join),
    st.just("--"),
)
ENV = st.dictionaries(
    st.sampled_from(
        ["LLAMA_ARG_PORT", "LLAMA_ARG_HOST", "LLAMA_ARG_CACHE_RAM", "LLAMA_ARG_N_PARALLEL", "X"]
    ),
    st.sampled_from(VALUES[:24]),
    max_size=2,
)
# the options a key leaves out, with values the engine takes (so the rest decides)
DROPPED = st.sampled_from(
    [["-p", "hi"], ["-p", "-c 9"], ["--port", "8080"], ["--port=9090"], ["--host", "0.0.0.0"],
     ["-n", "16"], ["-s", "1"], ["--temp", "0.5"], ["-sys", "be brief"], ["-lv", "4"]]
)  # fmt: skip
# what comes first: an rkllm demo's positional arguments (mostly good counts), llama.cpp's
# model, or anything
COUNT = st.one_of(st.sampled_from(["1", "64", "512", "2048"]), st.sampled_from(VALUES))
HEAD = st.one_of(
    st.tuples(st.just("m.rkllm"), COUNT, COUNT).map(list),
    st.just(["-m", "m.gguf"]),
    st.lists(WORD, max_size=3),
)
ARGV = st.tuples(
    st.sampled_from(PROGRAMS),
    HEAD,
    st.lists(st.one_of(WORD.map(lambda w: [w]), DROPPED), max_size=7),
).map(lambda t: [t[0], *t[1], *(w for part in t[2] for w in part)])

Outcome = tuple[Any, ...]
Reach = collections.Counter[str]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory holding the models the argvs name (relative paths), as the cwd; the code
    identity computed once (it does not depend on the argv)."""
    (tmp_path / "m.gguf").write_bytes(b"not a gguf, 32 bytes of weights.")
    (tmp_path / "m.rkllm").write_bytes(b"rkllm weights")
    (tmp_path / "p.toml").write_text('name = "p"\n')
    monkeypatch.chdir(tmp_path)
    identity = plans.code_identity()
    monkeypatch.setattr(plans, "code_identity", lambda: identity)
    yield tmp_path


def _key(policy: Path, argv: list[str], env: dict[str, str]) -> str | None:
    return plans.entry_name(policy, argv, options=["o"], cwd=policy.parent, env=env)


def _refused(err: GovernorError) -> Outcome:
    """A refusal is never stored (each launch compiles and says its own first reason, which
    may be the dropped --port's): what must agree is that it is one, and its exit code."""
    return ("refused", err.exit_code)


def _read(kind: str, cap: int | None, argv: list[str], env: dict[str, str]) -> Outcome:
    """What a launch's compile reads from the argv for a policy of ``kind`` (api/host.py
    preflight_engine, up to the compile), --host/--port masked."""
    try:
        args = engine_args(kind, cap, argv, max_cache_ram=1024, env=env)
        size = model_bytes(args)
        rk = check_rkllm(argv, cap) if kind == "rkllm" else None
    except GovernorError as err:
        return _refused(err)
    if args is not None:
        args = dataclasses.replace(args, argv=(), host=None, port=None)
    return ("ok", args, size, rk)


def test_the_key_and_a_fresh_read_of_the_argv_agree(
    workdir: Path, report_reach: Callable[[str], None]
) -> None:
    reach: Reach = collections.Counter()
    policy = workdir / "p.toml"

    @settings(max_examples=4000, suppress_health_check=[HealthCheck.too_slow])
    @given(ARGV, ENV, st.sampled_from([None, 2048]))
    def run(argv: list[str], env: dict[str, str], cap: int | None) -> None:
        reach["examples"] += 1
        key = _key(policy, argv, env)
        if key is None:
            reach["no key (compiled)"] += 1
            return
        reach["keyed"] += 1
        kept = argkey.compile_words(argv)
        kept_env = dict(argkey.compile_env(env))
        assert _key(policy, kept, kept_env) == key, (argv, kept)
        if kept != argv:
            reach["words dropped"] += 1
        for kind in KINDS:
            full = _read(kind, cap, argv, env)
            assert _read(kind, cap, kept, kept_env) == full, (kind, argv, kept, env)
            reach[f"{kind} {full[0]}"] += 1

    run()
    stages = ("keyed", "words dropped", "llama.cpp ok", "llama.cpp refused", "rkllm ok")
    parts = [f"{s} {reach[s]}/{reach['examples']}" for s in stages]
    report_reach("fuzz reach, plan-cache key vs argv read: " + ", ".join(parts))
    n = reach["examples"]
    assert reach["keyed"] >= n // 2, "most argvs must get a key"
    assert reach["words dropped"] >= n // 5, "many keys must leave words out"
    assert reach["llama.cpp ok"] >= n // 10 and reach["llama.cpp refused"] >= n // 10
    assert reach["rkllm ok"] >= n // 20


POLICY = """\
name = "kp"
[memory]
max = "1GiB"
[engine]
kind = "{kind}"
max_context_tokens = 4096
max_cache_ram = 1024
[prefetch]
mode = "none"
"""


def _compile(policy: Path, argv: list[str]) -> Outcome:
    """The whole compile of a launch (load, argv, probe, plan, preflight) as comparable data."""
    try:
        plan, _host, checked = preflight_engine(
            policy,
            tuple(argv),
            HostOptions(root=HOSTS / "rk3588"),
            probe_target=False,
            force=False,
        )
    except GovernorError as err:
        return _refused(err)
    est = None if checked.estimate is None else checked.estimate.to_dict()
    return ("ok", plan.to_json(), checked.warnings, est, checked.files, checked.prefetch_bytes)


def test_the_key_and_a_fresh_compile_agree_on_the_plan(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, report_reach: Callable[[str], None]
) -> None:
    for var in [v for v in os.environ if v.startswith("LLAMA_ARG_")]:
        monkeypatch.delenv(var)
    policies = {}
    for kind in KINDS:
        policies[kind] = workdir / f"{kind}.toml"
        policies[kind].write_text(POLICY.format(kind=kind))
    reach: Reach = collections.Counter()

    @settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
    @given(ARGV, st.sampled_from(KINDS))
    def run(argv: list[str], kind: str) -> None:
        reach["examples"] += 1
        key = _key(policies[kind], argv, {})
        if key is None:
            return
        kept = argkey.compile_words(argv)
        full = _compile(policies[kind], argv)
        assert _compile(policies[kind], kept) == full, (kind, argv, kept)
        reach["compiled" if full[0] == "ok" else "refused"] += 1

    run()
    report_reach(
        "fuzz reach, plan-cache key vs whole compile: "
        f"compiled {reach['compiled']}/{reach['examples']},"
        f" refused {reach['refused']}/{reach['examples']}"
    )
    assert reach["compiled"] >= reach["examples"] // 10, "many argvs must compile"
