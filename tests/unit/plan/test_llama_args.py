"""llama.cpp's option grammar (governor/plan/llama_args.py): the one walk of an argv by the
option tables (which words take a value), and the plan cache's view of an engine argv: the
words a compile reads stay, the prompt/seed/sampling/--host/--port go, and the walk is
llama.py's parser's own, so nothing the parser reads can be dropped.
"""

from __future__ import annotations

import dataclasses

import pytest

from governor.engines import llama as parser
from governor.engines.router import router_words
from governor.plan import llama_args as argkey

SRV = "/opt/llama/llama-server"
BASE = [SRV, "-m", "m.gguf", "-c", "512", "-np", "1", "--cache-ram", "256", "-p", "hello"]


def test_the_parser_reads_the_one_table() -> None:
    # llama.py keeps no copy: the tables it reads and the walk are the key's (spelled once,
    # issue 32; the walk: issue 44)
    tables = ("READ_OPTS", "UNSIZED_VALUE_OPTS", "UNSIZED_FLAGS", "FLAG_OPTS", "options")
    assert all(vars(parser)[name] is vars(argkey)[name] for name in (*tables, "ENV_OPTS"))
    known = set(argkey.READ_OPTS) | set(argkey.UNSIZED_VALUE_OPTS) | argkey.SKIP_VALUE_OPTS
    assert known == argkey.VALUE_OPTS
    assert argkey.IGNORED_OPTS <= argkey.VALUE_OPTS
    # dropped: only options the parser skips, or reads for the /health address alone
    assert argkey.IGNORED_OPTS & set(argkey.READ_OPTS) == {"--host", "--port"}
    assert not argkey.IGNORED_OPTS & set(argkey.UNSIZED_VALUE_OPTS)
    assert not argkey.IGNORED_OPTS & set(argkey.FLAG_OPTS)
    assert {argkey.ENV_OPTS[v] for v in argkey.IGNORED_ENV} == {"host", "port"}


@pytest.mark.parametrize(
    "other",
    [
        [*BASE[:-1], "a much longer prompt, new"],
        [*BASE, "--port", "9090"],
        [*BASE, "--port=9090", "--host", "0.0.0.0"],
        [*BASE, "-s", "7", "--temp", "0.2", "-n", "64"],
        [*BASE, "-f", "prompt.txt", "-sys", "be brief"],
    ],
)
def test_a_new_prompt_port_or_seed_keeps_the_key(other: list[str]) -> None:
    assert argkey.compile_words(other) == argkey.compile_words(BASE)


@pytest.mark.parametrize(
    "other",
    [
        [*BASE, "-c", "1024"],
        [*BASE, "-np", "2"],
        [*BASE, "--cache-ram=512"],
        [*BASE, "-ctk", "q8_0"],
        [*BASE, "-nr"],
        [*BASE, "--lora", "x.gguf"],
        [*BASE, "-ngl", "9"],  # not read today, kept all the same: unknown means a miss
        [*BASE, "--unknown-option"],
        ["/opt/llama/llama-completion", *BASE[1:]],
        [*BASE[:2], "other.gguf", *BASE[3:]],
    ],
)
def test_a_word_the_compile_reads_changes_the_key(other: list[str]) -> None:
    assert argkey.compile_words(other) != argkey.compile_words(BASE)


def test_a_value_that_looks_like_an_option_is_a_value() -> None:
    # -p's value "-c" is a prompt: dropped with -p; -m's value "-p" is a model: kept
    # (after the first three words: RKLLM reads those by position, they are always kept)
    head = [SRV, "-t", "2", "-nr"]
    assert argkey.compile_words([*head, "-p", "-c", "9"]) == [*head, "9"]
    assert argkey.compile_words([SRV, "-m", "-p", "x"]) == [SRV, "-m", "-p", "x"]


@pytest.mark.parametrize(
    "argv",
    [
        BASE,
        [*BASE, "--port", "9090", "--host", "::", "-s", "3", "-p", "-c 99"],
        [SRV, "-p", "-m", "-m", "real.gguf", "--lora=l.gguf", "-md", "d.gguf", "-nr"],
        [SRV, "-c", "8", "--", "-c", "9"],
        [SRV, "--port=80", "-kvu", "-n", "-np", "-ctk", "f16"],
    ],
)
def test_the_parser_reads_the_same_from_the_kept_words(argv: list[str]) -> None:
    env = {"LLAMA_ARG_CACHE_RAM": "128", "LLAMA_ARG_PORT": "81", "OTHER": "x"}
    full = parser.parse_llama_argv(argv, env)
    kept = parser.parse_llama_argv(argkey.compile_words(argv), dict(argkey.compile_env(env)))
    full = dataclasses.replace(full, argv=(), host=None, port=None)
    kept = dataclasses.replace(kept, argv=(), host=None, port=None)
    assert kept == full
    assert argkey.server_address(argv, env) == (
        parser.parse_llama_argv(argv, env).host,
        parser.parse_llama_argv(argv, env).port,
    )


def test_the_environment_key_is_the_llama_arg_variables_but_the_address() -> None:
    env = {"LLAMA_ARG_CACHE_RAM": "128", "LLAMA_ARG_PORT": "81", "LLAMA_ARG_HOST": "h", "X": "1"}
    assert argkey.compile_env(env) == [("LLAMA_ARG_CACHE_RAM", "128")]


HEAD = [SRV, "-m", "m.gguf", "-nr"]  # the first three words are kept whatever they are


@pytest.mark.parametrize(
    "argv",
    [
        [*HEAD, "--port", "http"],
        [*HEAD, "--port=-1"],
        [*HEAD, "--port", "99999"],
        [*HEAD, "--port", "0"],
        [*HEAD, "--port", "\u0668\u0660"],  # Arabic-Indic "80": int() reads it, stoi does not
        [*HEAD, "--port"],
        [*HEAD, "--host"],  # the cache bug of issue 35: a hit where the compile says 65
        [*HEAD, "--host="],
        [*HEAD, "--host", " , "],
    ],
)
def test_an_address_the_parser_refuses_has_no_key(argv: list[str]) -> None:
    with pytest.raises(parser.EngineArgvError):
        parser.parse_llama_argv(argv)
    with pytest.raises(argkey.Unkeyable):
        argkey.compile_words(argv)


@pytest.mark.parametrize(
    "env", [{"LLAMA_ARG_PORT": "x"}, {"LLAMA_ARG_PORT": "65536"}, {"LLAMA_ARG_HOST": ","}]
)
def test_an_address_variable_the_parser_refuses_has_no_key(env: dict[str, str]) -> None:
    with pytest.raises(parser.EngineArgvError):
        parser.parse_llama_argv([SRV], env)
    assert argkey.compile_words([SRV]) == [SRV]  # the argv alone has a key: the env refuses
    with pytest.raises(argkey.Unkeyable):
        argkey.compile_env(env)


def test_the_first_three_words_are_kept_for_rkllms_positional_arguments() -> None:
    # llm_demo MODEL MAX_NEW_TOKENS MAX_CONTEXT_LEN: "-p" there is a (bad) count, not a prompt
    assert argkey.compile_words(["llm_demo", "m.rkllm", "-p", "x"]) == [
        "llm_demo",
        "m.rkllm",
        "-p",
        "x",
    ]
    assert argkey.compile_words(["llm_demo", "m.rkllm", "1", "2", "-p", "x"]) == [
        "llm_demo",
        "m.rkllm",
        "1",
        "2",
    ]


def test_options_pair_each_value_option_with_the_next_word_whatever_it_looks_like() -> None:
    """The one walk (issue 44): a value option takes the next word (`-p -c` is a prompt), a
    long or short NAME=VALUE of one is one step, any other word its own step, ``--`` the last
    step with every word after it; each step says where it starts."""
    words = ["-m", "a.gguf", "-p", "-c", "--ctx-size=9", "-c=7", "--mlock", "x", "-c"]
    steps = [(o.name, o.value, o.words, o.at, o.inline) for o in argkey.options(words)]
    assert steps == [
        ("-m", "a.gguf", ("-m", "a.gguf"), 0, False),
        ("-p", "-c", ("-p", "-c"), 2, False),
        ("--ctx-size", "9", ("--ctx-size=9",), 4, True),
        ("-c", "7", ("-c=7",), 5, True),
        ("--mlock", None, ("--mlock",), 6, False),
        ("x", None, ("x",), 7, False),
        ("-c", None, ("-c",), 8, False),  # no word left for its value
    ]
    tail = list(argkey.options(["--mlock=1", "--", "-c", "9"]))
    assert [(o.name, o.words) for o in tail] == [
        ("--mlock=1", ("--mlock=1",)),
        ("--", ("--", "-c", "9")),
    ]


def test_every_walk_reads_a_value_that_looks_like_an_option_as_a_value() -> None:
    """The cache key, the parser, the /health address and the router's words all walk by
    the one grammar: `-a --port` names an alias "--port", not a port."""
    argv = [SRV, "-m", "m.gguf", "-a", "--port", "--port", "9000"]
    assert argkey.server_address(argv, {}) == (None, 9000)
    assert argkey.compile_words(argv) == [SRV, "-m", "m.gguf", "-a", "--port"]
    assert parser.parse_llama_argv(argv).port == 9000
    # -mm's value is -mm's, even when it spells a router-only flag
    assert router_words([SRV, "-mm", "--models-autoload", "--models-autoload"]) == [
        "-mm",
        "--models-autoload",
    ]
