"""llama-server's memory in the estimate (governor/engines/{llama,estimate,server}.py), its
caps in the preflight and `governor init` for a server (governor/init/server.py).

Shapes are those of the KV-heavy synthetic model scripts/engine-setup writes for the server
tests (kvserver: 32 layers, n_embd 512, f16 KV = 64 KiB per token, 64 MiB of q8_0 weights).
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from governor.engines import estimate as em
from governor.engines import settings as es
from governor.engines.gguf import GgufInfo, Tensor
from governor.engines.llama import EngineArgvError, parse_llama_argv
from governor.engines.preflight import engine_args
from governor.errors import PolicyError

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
SERVER = "/opt/llama/bin/llama-server"


def _kvserver(**changes: object) -> GgufInfo:
    n_layer, d, ff, vocab = 32, 512, 512, 4096
    q8 = 34 / 32
    t = [Tensor("token_embd.weight", "Q8_0", vocab * d, int(vocab * d * q8), vocab)]
    for i in range(n_layer):
        for name, rows, cols in (
            ("attn_q", d, d), ("attn_k", d, d), ("attn_v", d, d), ("attn_output", d, d),
            ("ffn_gate", ff, d), ("ffn_up", ff, d), ("ffn_down", d, ff),
        ):  # fmt: skip
            t.append(
                Tensor(f"blk.{i}.{name}.weight", "Q8_0", rows * cols, int(rows * cols * q8), rows)
            )
    info = GgufInfo(
        path="kvserver.gguf", file_bytes=67_000_000, architecture="llama", n_layer=n_layer,
        n_embd=d, n_head=8, n_head_kv=8, n_ctx_train=8192, vocab=vocab, key_length=64,
        value_length=64, file_type="Q8_0", tensors=tuple(t),
    )  # fmt: skip
    return replace(info, **changes)  # type: ignore[arg-type]


def _est(argv: list[str], budget: int | None = None, info: GgufInfo | None = None) -> em.Estimate:
    info = info or _kvserver()
    args = parse_llama_argv([SERVER, "-m", "kvserver.gguf", *argv])
    s = es.settings_from_argv(args, info.n_ctx_train)
    return em.estimate(info, s, family="x86-avx2", budget=budget, unsized=args.unsized)


# ------------------------------------------------------------------------------ the argv


def test_server_options_are_read_and_the_environment_is_overridden_by_the_command_line() -> None:
    env = {"LLAMA_ARG_CACHE_RAM": "512", "LLAMA_ARG_N_PARALLEL": "3", "LLAMA_ARG_CTX_SIZE": "2048",
           "LLAMA_ARG_KV_UNIFIED": "true", "LLAMA_ARG_PORT": "9000"}  # fmt: skip
    a = parse_llama_argv([SERVER, "-m", "m.gguf", "--cache-ram", "300", "--port=8080"], env)
    assert a.server and a.cache_ram == 300 and a.port == 8080  # the command line wins
    assert a.parallel == 3 and a.ctx == 2048 and a.kv_unified is True  # the environment fills in
    b = parse_llama_argv([SERVER, "-np", "2", "-no-kvu", "-cram", "-1", "-ctxcp", "4"])
    assert (b.parallel, b.kv_unified, b.cache_ram, b.ctx_checkpoints) == (2, False, -1, 4)
    assert not parse_llama_argv(["/usr/bin/llama-completion", "-np", "2"]).server
    # without an environment given, LLAMA_ARG_* of ours is not read
    assert parse_llama_argv([SERVER], None).cache_ram is None


@pytest.mark.parametrize(
    ("argv", "why"),
    [(["-np", "0"], "-np/--parallel is 0"), (["--cache-ram", "-2"], "negative"),
     (["--cache-ram", "lots"], "not an integer"), (["-np"], "has no value")],
)  # fmt: skip
def test_server_options_it_cannot_read_are_refused(argv: list[str], why: str) -> None:
    with pytest.raises(EngineArgvError, match=why):
        parse_llama_argv([SERVER, *argv])


def test_options_it_cannot_size_are_named_in_warnings_never_dropped() -> None:
    est = _est(["-c", "1024", "--lora", "a.gguf", "-md", "d.gguf", "--swa-full", "-cram", "0"])
    text = em.render(est)
    assert sum("not sized:" in w for w in est.warnings) == 3
    assert "warning: not sized: --lora" in text and "--model-draft" in text
    assert "--swa-full" in text


# ------------------------------------------------------------------------------ the terms


def test_defaults_are_four_unified_slots_and_an_8_gib_prompt_cache() -> None:
    est = _est(["-c", "4096"])
    s = est.settings
    assert (s.slots, s.kv_unified, s.cache_ram_mib, s.ctx_checkpoints) == (4, True, 8192, 32)
    assert est.term("kv_cache") == 4096 * 64 * 1024  # 64 KiB of f16 KV per token, one buffer
    assert est.term("prompt_cache") == 8192 * MIB
    assert est.term("checkpoints") == 0  # no sliding window: the server makes none
    assert est.total > 8192 * MIB
    # the ready server measured 339 MiB resident (-c 4096 -np 1, cache empty): the rest is that
    rest = est.total - est.term("prompt_cache")
    assert 339 * MIB * 0.9 < rest < 339 * MIB * 1.1


def test_explicit_slots_split_the_context_and_pad_each_slot() -> None:
    split = _est(["-c", "1000", "-np", "3", "-cram", "0"]).settings
    # -c 1000 -> 1024 cells; 1024 // 3 = 341 per slot, padded to 512: 1536 cells in all
    assert split.slot_cells == 512 and split.kv_cells == 1536
    unified = _est(["-c", "1000", "-np", "3", "-kvu", "-cram", "0"]).settings
    assert unified.kv_cells == 1024 and unified.slot_cells == 1024
    odd = _est(["-c", "4096", "-np", "3", "-cram", "0"]).settings
    assert odd.slot_cells == 1536 and odd.kv_cells == 4608  # 4096 // 3 = 1365 -> 1536 each


def test_an_unlimited_prompt_cache_never_fits_and_the_advice_names_the_option() -> None:
    est = _est(["-c", "2048", "--cache-ram", "-1"], budget=1024 * MIB)
    assert est.unbounded and not est.fits and est.max_ctx is None
    assert est.advice[0].startswith(f"--cache-ram {est.max_cache_ram} ")
    assert "no limit" in em.render(est)


def test_the_largest_cache_ram_and_context_that_fit() -> None:
    budget = 1024 * MIB
    est = _est(["-c", "4096", "-np", "1"], budget=budget)  # default 8192 MiB: does not fit
    assert not est.fits and est.max_cache_ram is not None
    assert (
        est.advice[0]
        == f"--cache-ram {est.max_cache_ram} (largest prompt cache that fits at -c 4096)"
    )
    fixed = _est(["-c", "4096", "-np", "1", "--cache-ram", str(est.max_cache_ram)], budget=budget)
    assert fixed.fits and fixed.total <= budget
    over = _est(
        ["-c", "4096", "-np", "1", "--cache-ram", str(est.max_cache_ram + 1)], budget=budget
    )
    assert not over.fits
    # with the cache fixed the largest -c is found around it
    small = _est(["-c", "8192", "-np", "1", "--cache-ram", "256"], budget=768 * MIB)
    assert not small.fits and small.max_ctx is not None and small.max_ctx < 8192
    at = _est(["-c", str(small.max_ctx), "-np", "1", "--cache-ram", "256"], budget=768 * MIB)
    assert at.fits
    assert not _est(["-c", str(small.max_ctx + 256), "-np", "1", "--cache-ram", "256"],
                    budget=768 * MIB).fits  # fmt: skip


def test_sliding_window_models_get_their_checkpoints_sized() -> None:
    info = _kvserver(sliding_window=512)
    est = _est(["-c", "4096", "-np", "2", "-cram", "0", "-ctxcp", "8"], info=info)
    per = 1024 * 64 * 1024  # SWA 512 + ubatch 512 cells, every layer
    assert est.term("checkpoints") == 2 * 8 * per
    none = _est(["-c", "4096", "-np", "2", "-cram", "0", "-ctxcp", "0"], info=info)
    assert none.term("checkpoints") == 0


def test_a_recurrent_models_checkpoints_are_warned_about() -> None:
    est = _est(["-c", "1024", "-cram", "0"], info=_kvserver(recurrent=True))
    assert any("recurrent model" in w for w in est.warnings)
    assert est.term("checkpoints") == 0
    assert parse_llama_argv(["llama-server", "-m", "m.gguf"]).server_ctx_checkpoints == 32


def test_a_one_shot_engine_has_none_of_the_server_terms() -> None:
    info = _kvserver()
    args = parse_llama_argv(["llama-completion", "-m", "m.gguf", "-c", "4096", "-np", "4"])
    est = em.estimate(info, es.settings_from_argv(args, 8192), family="x86-avx2")
    assert est.term("prompt_cache") == 0 and "server" not in est.to_dict()
    assert all(t.name not in ("prompt_cache", "checkpoints") for t in est.terms)


# ------------------------------------------------------------------------------ the caps


@pytest.mark.parametrize(
    ("extra", "said"),
    [([], "no --cache-ram (llama-server's default 8192 MiB)"),
     (["--cache-ram", "-1"], "--cache-ram -1 (no limit)"),
     (["--cache-ram", "300"], "--cache-ram 300")],
)  # fmt: skip
def test_max_cache_ram_refuses_a_bigger_prompt_cache(extra: list[str], said: str) -> None:
    with pytest.raises(PolicyError) as err:
        engine_args("llama.cpp", None, [SERVER, "-c", "512", *extra], max_cache_ram=256)
    assert said in str(err.value) and "engine.max_cache_ram = 256 MiB" in str(err.value)
    assert err.value.hint is not None and "--cache-ram 256" in err.value.hint
    ok = engine_args("llama.cpp", None, [SERVER, "--cache-ram", "256"], max_cache_ram=256)
    assert ok is not None and ok.cache_ram == 256
    env = engine_args("llama.cpp", None, [SERVER], max_cache_ram=256,
                      env={"LLAMA_ARG_CACHE_RAM": "128"})  # fmt: skip
    assert env is not None and env.cache_ram == 128
    # a one-shot engine has no prompt cache to cap
    assert engine_args("llama.cpp", None, ["llama-completion"], max_cache_ram=0) is not None


def test_an_absent_cache_ram_is_llama_servers_default_for_the_cap_and_the_estimate() -> None:
    """One decision (governor/engines/llama.py SERVER_CACHE_RAM_MIB): no --cache-ram is 8192
    MiB for the estimate's prompt cache and for engine.max_cache_ram alike, so a cap at or
    above it passes and one below it is refused."""
    args = engine_args("llama.cpp", None, [SERVER, "-c", "512"], max_cache_ram=8192)
    assert args is not None and args.cache_ram is None and args.server_cache_ram_mib == 8192
    assert _est(["-c", "512"]).settings.cache_ram_mib == 8192
    with pytest.raises(PolicyError, match="default 8192 MiB"):
        engine_args("llama.cpp", None, [SERVER, "-c", "512"], max_cache_ram=8191)


# ------------------------------------------------------------------------------ the CLI


def _governor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from governor.cli.app import main

    code: int | str | None = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


@pytest.fixture
def kvmodel(tmp_path: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from engine.make_gguf import main as make
    finally:
        sys.path.pop(0)
    path = tmp_path / "kv.gguf"
    make(["-o", str(path), "--preset", "tiny", "--n-layer", "8", "--n-embd", "256",
          "--n-ff", "256", "--n-ctx-train", "4096"])  # fmt: skip
    return path


def test_init_for_a_server_caps_the_prompt_cache_and_check_accepts_what_it_printed(
    kvmodel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(HOSTS / "cgroup2-full")
    policy = tmp_path / "chat.toml"
    code, _out, err = _governor(
        capsys, "--root", root, "init", "--model", str(kvmodel), "--board-memory", "512M",
        "--engine-argv", f"{SERVER} -np 1 --port 8080", "--name", "chat", "-o", str(policy),
    )  # fmt: skip
    assert code == 0, err
    text = policy.read_text()
    data = tomllib.loads(text)
    cap = data["engine"]["max_cache_ram"]
    ctx = data["engine"]["max_context_tokens"]
    assert 0 < cap < 8192
    line = next(x for x in text.splitlines() if x.startswith("#   governor check"))
    assert f"-c {ctx} --cache-ram {cap} -np 1 --port 8080" in line
    # the estimate at the printed line fits the policy's memory.max
    argv = line.split("--engine-argv ", 1)[1].strip("'").split()
    est = em.estimate(
        _info_of(kvmodel), es.settings_from_argv(parse_llama_argv(argv), 4096), family="none"
    )
    assert est.total <= int(data["memory"]["max"].removesuffix("MiB")) * MIB
    # the default prompt cache is refused by the policy init wrote, naming the option
    code, _out, err = _governor(
        capsys, "--root", root, "check", str(policy), "--engine-argv",
        f"{SERVER} -m {kvmodel} -c {ctx} -np 1",
    )  # fmt: skip
    assert code == 65
    assert "engine.max_cache_ram" in err and f"--cache-ram {cap}" in err


def _info_of(path: Path) -> GgufInfo:
    from governor.engines.gguf import read_gguf

    return read_gguf(path)


def test_estimate_shows_the_server_terms_and_the_largest_cache_ram(
    kvmodel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _governor(
        capsys, "estimate", str(kvmodel), "-c", "2048", "--budget", "256M",
        "--engine-argv", f"{SERVER} -np 2",
    )  # fmt: skip
    assert "prompt_cache" in out and "8192.0 MiB" in out, out + err
    assert "largest --cache-ram that fits at -c 2048:" in out
    assert "fix: --cache-ram " in out
    assert code == 1  # does not fit (estimate's documented exit for a model over budget)
