"""What governor reads from a llama.cpp argv, and the checks it runs on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.compile.compiler import compile_plan
from governor.engines.llama import EngineArgs, EngineArgvError, model_parts, parse_llama_argv
from governor.engines.preflight import engine_args, engine_warnings
from governor.errors import PolicyError
from governor.plan.host import probe
from governor.policy.loader import load_text
from governor.policy.model import Policy

RK3588 = Path(__file__).resolve().parents[2] / "fixtures" / "hosts" / "rk3588"


def read_argv(policy: Policy, argv: tuple[str, ...]) -> EngineArgs | None:
    return engine_args(policy.engine.kind, policy.engine.max_context_tokens, argv)


def test_short_long_and_equals_forms_are_read_and_argv_is_kept() -> None:
    argv = ("./llama-completion", "-m", "m.gguf", "--ctx-size=2048", "-t", "4", "-p", "-c 9",
            "-lm", "mmap+mlock", "-nr")  # fmt: skip
    args = parse_llama_argv(argv)
    assert args.argv == argv
    assert (args.model, args.ctx, args.threads) == ("m.gguf", 2048, 4)
    assert args.locks_memory
    assert not args.repacks


def test_old_mlock_flag_counts_as_locking() -> None:
    assert parse_llama_argv(["llama-cli", "--mlock", "-m", "x"]).locks_memory
    assert not parse_llama_argv(["llama-cli", "-m", "x"]).locks_memory


def test_prompt_text_that_looks_like_a_flag_is_not_read_as_one() -> None:
    args = parse_llama_argv(["llama", "-p", "-c 4096 please", "-c", "512"])
    assert args.ctx == 512
    args = parse_llama_argv(["llama", "-p", "-c", "-n", "8", "-c", "256"])
    assert args.ctx == 256


@pytest.mark.parametrize("argv", [["llama", "-c", "abc"], ["llama", "-c"], ["llama", "-c", "-5"]])
def test_unreadable_context_is_an_argv_error(argv: list[str]) -> None:
    with pytest.raises(EngineArgvError):
        parse_llama_argv(argv)


def test_split_gguf_names_every_part() -> None:
    parts = model_parts("/m/qwen-00001-of-00003.gguf")
    assert [p.name for p in parts] == [
        "qwen-00001-of-00003.gguf",
        "qwen-00002-of-00003.gguf",
        "qwen-00003-of-00003.gguf",
    ]
    assert model_parts("/m/plain.gguf") == [Path("/m/plain.gguf")]


POLICY = """
name = "chat"
[engine]
kind = "llama.cpp"
max_context_tokens = 2048
[cpu]
cpus = "all"
[process]
memlock = "unlimited"
"""


def test_context_above_the_cap_is_refused_with_exit_65() -> None:
    with pytest.raises(PolicyError) as err:
        read_argv(load_text(POLICY), ("llama", "-m", "m", "-c", "4096"))
    assert err.value.exit_code == 65
    assert "4096" in str(err.value)
    assert "2048" in str(err.value)
    assert err.value.field == "engine.max_context_tokens"


def test_context_zero_means_n_ctx_train_and_is_refused_under_a_cap() -> None:
    with pytest.raises(PolicyError, match="n_ctx_train"):
        read_argv(load_text(POLICY), ("llama", "-c", "0"))


def test_generic_engines_are_not_parsed() -> None:
    policy = load_text('name = "g"\n[engine]\nkind = "generic"\nmax_context_tokens = 8\n')
    assert read_argv(policy, ("prog", "-c", "99999")) is None


def test_warnings_for_missing_c_threads_across_clusters_and_memlock_without_lock() -> None:
    policy = load_text(POLICY)
    host = probe(RK3588)
    plan = compile_plan(policy, host)
    args = read_argv(policy, ("llama", "-m", "m", "-t", "6"))
    warnings = engine_warnings(args, plan, host)
    text = "\n".join(warnings)
    assert "no -c" in text
    assert "spans both core types" in text  # cpus = all on a big.LITTLE board
    assert "will not lock" in text
    fine = read_argv(policy, ("llama", "-m", "m", "-c", "512", "-t", "4", "-lm", "mlock"))
    big_plan = compile_plan(load_text(POLICY.replace('cpus = "all"', 'cpus = "big"')), host)
    assert engine_warnings(fine, big_plan, host) == []


def test_threads_above_pinned_cpus_is_warned() -> None:
    policy = load_text(POLICY.replace('cpus = "all"', 'cpus = "big"'))
    host = probe(RK3588)
    args = read_argv(policy, ("llama", "-c", "512", "-t", "8", "-lm", "mlock"))
    warnings = engine_warnings(args, compile_plan(policy, host), host)
    assert any("exceeds the 4 pinned CPUs" in w for w in warnings)
