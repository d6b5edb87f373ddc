"""The GGUF header reader and the resident-memory estimate (governor/engines/{gguf,estimate}.py).

Pure tests use a GgufInfo with the shapes of the 1.1 GiB Qwen-1.8B-like model of
notes/engine.md and check the terms against llama.cpp's own log lines there (KV 384 MiB at
-c 2048, CPU_REPACK 651.38 MiB, compute buffer 304.75 MiB). File tests write tiny GGUFs with
tests/engine/make_gguf.py (needs the `gguf` package of the dev extra) and a corrupt one.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from governor.cli.app import main
from governor.engines import estimate as em
from governor.engines import settings as es
from governor.engines.gguf import GgufInfo, Tensor, read_gguf
from governor.engines.llama import parse_llama_argv
from governor.errors import EXIT_POLICY, PolicyError
from governor.kernel.parse import cpuinfo_machine

MIB = 1 << 20
Q40 = 18 / 32
Q80 = 34 / 32
REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "hosts"


def _qwen18b() -> GgufInfo:
    n_layer, d, ff, vocab = 24, 2048, 5504, 151936
    t = [Tensor("token_embd.weight", "Q4_0", vocab * d, int(vocab * d * Q40), vocab)]
    for i in range(n_layer):
        for name, rows, cols in (
            ("attn_q", d, d), ("attn_k", d, d), ("attn_v", d, d), ("attn_output", d, d),
            ("ffn_gate", ff, d), ("ffn_up", ff, d), ("ffn_down", d, ff),
        ):  # fmt: skip
            t.append(
                Tensor(f"blk.{i}.{name}.weight", "Q4_0", rows * cols, int(rows * cols * Q40), rows)
            )
        t.append(Tensor(f"blk.{i}.attn_norm.weight", "F32", d, 4 * d, 1))
    t.append(Tensor("output.weight", "Q8_0", vocab * d, int(vocab * d * Q80), vocab))
    return GgufInfo(
        path="q18.gguf", file_bytes=1_192_911_264, architecture="llama", n_layer=n_layer, n_embd=d,
        n_head=16, n_head_kv=16, n_ctx_train=32768, vocab=vocab, key_length=128,
        value_length=128, file_type="Q4_0", tensors=tuple(t),
    )  # fmt: skip


def test_terms_match_llama_cpp_log_lines_for_the_big_model() -> None:
    info = _qwen18b()
    est = em.estimate(info, es.Settings(ctx=2048), family="x86-avx2")
    assert est.term("kv_cache") == 384 * MIB  # llama_kv_cache: size = 384.00 MiB
    assert est.term("repack") / MIB == pytest.approx(651.38, abs=0.01)  # CPU_REPACK buffer
    assert est.compute_reserved / MIB == pytest.approx(304.75, rel=0.01)  # sched_reserve
    assert est.term("weights") / MIB == pytest.approx(1133.98, rel=0.01)  # CPU_Mapped
    assert info.quant == "Q4_0"


# llama.cpp 0c1e57098 cross-built for arm64 (scripts/arm64-setup), the big model at -c 2048
# under qemu-aarch64 (perf/arm_repack.py): its `CPU_REPACK model buffer size` line per CPU
ARM_CPU_REPACK_MIB = {
    "none": 0.0,  # -cpu cortex-a53 (armv8.0 variant): no line, nothing repacked
    "arm-dotprod": 966.67,  # -cpu cortex-a76: Q4_0 as q4_0_4x4 and the Q8_0 output as q8_0_4x4
    "arm-i8mm": 966.67,  # -cpu max: q4_0_4x8 and q8_0_4x8, the same bytes
}


@pytest.mark.parametrize(("family", "mib"), sorted(ARM_CPU_REPACK_MIB.items()))
def test_arm_repack_term_matches_llama_cpp_on_arm(family: str, mib: float) -> None:
    est = em.estimate(_qwen18b(), es.Settings(ctx=2048), family=family)
    assert est.term("repack") / MIB == pytest.approx(mib, abs=0.01)
    assert est.term("kv_cache") == 384 * MIB  # the same on every CPU


def test_arm_repacks_the_q8_0_output_that_x86_leaves_alone() -> None:
    info = _qwen18b()
    out = next(t for t in info.tensors if t.name == "output.weight")
    x86 = em.repack_bytes(info, "x86-avx2")
    for family in ("arm-dotprod", "arm-i8mm"):
        assert em.repack_bytes(info, family) == x86 + out.n_bytes


def test_cpuinfo_names_the_machine_of_another_root() -> None:
    rk3588 = (FIXTURES / "rk3588" / "proc" / "cpuinfo").read_text()
    assert cpuinfo_machine(rk3588, "x86_64") == "aarch64"
    assert cpuinfo_machine("vendor_id\t: AuthenticAMD\nflags\t\t: avx2\n", "aarch64") == "x86_64"
    assert cpuinfo_machine("", "riscv64") == "riscv64"


def test_estimate_of_an_arm_board_tree_uses_its_cpu_not_this_one() -> None:
    from governor.engines.budget import host_family

    assert host_family(FIXTURES / "rk3588") == "arm-dotprod"  # whatever this machine is


def test_no_repack_flag_and_non_mmap_drop_the_repack_term() -> None:
    info = _qwen18b()
    args = parse_llama_argv(["llama-completion", "-m", "x.gguf", "-c", "2048", "-nr"])
    s = es.settings_from_argv(args, info.n_ctx_train)
    assert not s.repack and s.ctx == 2048
    assert em.estimate(info, s, family="x86-avx2").term("repack") == 0
    none = es.Settings(ctx=2048, load_mode="none")
    assert em.estimate(info, none, family="x86-avx2").term("repack") == 0
    assert em.estimate(info, es.Settings(ctx=2048), family="none").term("repack") == 0


def test_missing_ctx_means_n_ctx_train_and_cache_types_scale_kv() -> None:
    info = _qwen18b()
    s = es.settings_from_argv(parse_llama_argv(["x", "-m", "a.gguf"]), info.n_ctx_train)
    assert s.ctx == 32768
    assert em.kv_bytes(info, s) == 6144 * MIB  # notes/engine.md: -c 0 -> 6 GiB of KV
    q8 = es.settings_from_argv(
        parse_llama_argv(["x", "-c", "2048", "-ctk", "q8_0", "-ctv", "q4_0"]), 32768
    )
    assert em.kv_bytes(info, q8) == int(24 * 2048 * 2048 * (34 / 32 + 18 / 32))


def test_kv_cells_are_padded_to_256_and_gqa_shrinks_kv() -> None:
    info = replace(_qwen18b(), n_head_kv=4)
    assert info.n_embd_k == 512
    assert em.kv_bytes(info, es.Settings(ctx=300)) == 2 * 24 * 512 * 512 * 2


def test_ubatch_is_capped_by_batch_and_ctx() -> None:
    info = _qwen18b()
    small = em.compute_reserved(info, es.Settings(ctx=2048, ubatch=128))
    assert small / MIB == pytest.approx(76, rel=0.03)  # notes/engine.md: 76 MiB at -ub 128
    assert em.compute_reserved(info, es.Settings(ctx=64)) == 64 * (151936 + 4096) * 4


def test_compute_counts_the_logits_part_up_to_its_cap() -> None:
    """The logits part (vocab x ubatch f32) of the reserve counts up to LOGITS_COUNTED_MAX: only
    the output rows of it are written. The 1.1 GiB model's -nr run in the kernel guest
    (docs/calibration.md: memory.peak 1585.4 MiB at -c 2048, b11312) is then within the band,
    where all of its 297 MiB of logits at 45 % put it 5.8 % over; a 32000 vocab (the small
    model: 62.5 MiB of logits) keeps the share of its whole reserve."""
    info = _qwen18b()
    s = es.Settings(ctx=2048, repack=False)
    est = em.estimate(info, s, family="x86-avx2")
    logits = 512 * 151936 * 4
    rest = est.compute_reserved - logits
    assert est.term("compute") == int((rest + 128 * MIB) * em.COMPUTE_TOUCHED_SHARE)
    assert "counted up to 128 MiB" in next(t.detail for t in est.terms if t.name == "compute")
    measured = 1585.4 * MIB
    assert measured <= est.total <= measured * 1.10, est.total / measured
    small = replace(info, vocab=32000, n_embd=1024)
    got = em.estimate(small, s, family="x86-avx2")
    assert got.term("compute") == int(got.compute_reserved * em.COMPUTE_TOUCHED_SHARE)
    # -ub 128: 74 MiB of logits, under the cap: the share of the whole reserve
    ub = es.Settings(ctx=2048, ubatch=128, repack=False)
    low = em.estimate(info, ub, family="x86-avx2")
    assert low.term("compute") == int(low.compute_reserved * em.COMPUTE_TOUCHED_SHARE)


def test_budget_gives_largest_ctx_and_fixes() -> None:
    info = _qwen18b()
    budget = 1900 * MIB
    est = em.estimate(info, es.Settings(ctx=2048), family="x86-avx2", budget=budget)
    assert not est.fits
    assert any(a.startswith("-nr") for a in est.advice)
    assert any("smaller quant" not in a for a in est.advice)
    assert est.max_ctx is None or est.max_ctx < 2048
    nr = em.estimate(info, es.Settings(ctx=2048, repack=False), family="x86-avx2", budget=budget)
    assert nr.fits and nr.advice == ()
    assert nr.max_ctx is not None and nr.max_ctx >= 2048
    assert em.total_for(info, replace(nr.settings, ctx=nr.max_ctx), family="x86-avx2") <= budget
    text = em.render(est)
    assert "does NOT fit" in text and "fix: -nr" in text


def test_smaller_quant_advice_for_q8_model() -> None:
    info = _qwen18b()
    q8 = replace(
        info, tensors=tuple(replace(t, type="Q8_0") if t.rows > 1 else t for t in info.tensors)
    )
    name, size = em.smaller_quant(q8) or ("", 0)
    assert name == "Q4_K" and size < q8.tensor_bytes
    assert em.smaller_quant(info) is None


@pytest.mark.parametrize(
    ("machine", "cpuinfo", "family"),
    [
        ("x86_64", "flags\t\t: fpu sse avx avx2 fma\n", "x86-avx2"),
        ("x86_64", "flags\t\t: avx avx2 avx512f\n", "x86-avx512"),
        ("x86_64", "flags\t\t: sse4_2\n", "none"),
        ("aarch64", "Features\t: fp asimd asimddp\n", "arm-dotprod"),
        ("aarch64", "Features\t: fp asimd asimddp sve i8mm bf16\n", "arm-i8mm"),
        ("aarch64", "Features\t: fp asimd\n", "none"),
        ("riscv64", "", "none"),
    ],
)
def test_cpu_family(machine: str, cpuinfo: str, family: str) -> None:
    assert em.cpu_family(machine, cpuinfo) == family


# ------------------------------------------------------------------ real files (gguf package)


def _make(tmp_path: Path, *extra: str) -> Path:
    pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO / "tests" / "engine"))
    try:
        import make_gguf  # type: ignore[import-not-found,unused-ignore]
    finally:
        sys.path.pop(0)
    out = tmp_path / "tiny.gguf"
    assert make_gguf.main(["--preset", "tiny", "-o", str(out), *extra]) == 0
    return out


def test_read_header_of_a_written_model(tmp_path: Path) -> None:
    path = _make(tmp_path, "--quant", "q4_0", "--n-head-kv", "2")
    info = read_gguf(path)
    assert (info.architecture, info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == (
        "llama", 4, 256, 4, 2,
    )  # fmt: skip
    assert (info.n_ctx_train, info.vocab, info.quant, info.file_type) == (
        2048,
        4096,
        "Q4_0",
        "Q4_0",
    )
    assert info.n_embd_k == 128
    assert info.tensor_bytes <= info.file_bytes < info.tensor_bytes + 2 * MIB
    est = em.estimate(info, es.Settings(ctx=512), family="x86-avx2")
    assert est.term("repack") > 0  # q4_0 blk weights (token_embd excluded)


@pytest.mark.parametrize("cut", [0, 10, 200, 4000])
def test_corrupt_or_truncated_header_is_65_not_a_traceback(
    tmp_path: Path, cut: int, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _make(tmp_path)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(good.read_bytes()[:cut])
    with pytest.raises(PolicyError):
        read_gguf(bad)
    with pytest.raises(SystemExit) as info:
        main(["estimate", str(bad), "-c", "512"])
    _out, err = capsys.readouterr()
    assert info.value.code == EXIT_POLICY
    assert err.startswith("governor: not a readable GGUF model") and "Traceback" not in err


def test_garbage_after_magic_is_65(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\xff" * 64)
    with pytest.raises(SystemExit) as info:
        main(["estimate", str(bad)])
    assert info.value.code == EXIT_POLICY
    assert "Traceback" not in capsys.readouterr().err


def test_estimate_cli_prints_terms_and_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _make(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(
            ["estimate", str(path), "-c", "1024", "--engine-argv", "-nr -ub 128", "--budget", "1G"]
        )
    out, _ = capsys.readouterr()
    assert info.value.code == 0
    for word in ("weights", "kv_cache", "compute", "margin", "total", "fits", "largest -c"):
        assert word in out
    with pytest.raises(SystemExit) as info:
        main(["estimate", str(path), "-c", "1024", "--budget", "20M"])
    assert info.value.code == 1
    assert "fix:" in capsys.readouterr().out


def test_check_engine_argv_refuses_a_gguf_that_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _make(tmp_path)
    policy = tmp_path / "p.toml"
    body = 'name = "chat"\nslice = "x.slice"\n[memory]\nmax = "{}"\n[engine]\nkind = "llama.cpp"\n'
    policy.write_text(body.format("20M"))
    root = str(REPO / "tests" / "fixtures" / "hosts" / "rk3588")
    argv = f"llama-completion -m {model} -c 2048"
    with pytest.raises(SystemExit) as info:
        main(["--root", root, "check", str(policy), "--engine-argv", argv])
    _out, err = capsys.readouterr()
    assert info.value.code == EXIT_POLICY
    assert "above memory.max 20 MiB" in err and "hint:" in err and "--force" in err
    with pytest.raises(SystemExit) as info:
        main(["--root", root, "check", str(policy), "--engine-argv", argv, "--force"])
    assert info.value.code == 0
    policy.write_text(body.format("200M"))
    with pytest.raises(SystemExit) as info:
        main(["--root", root, "check", str(policy), "--engine-argv", argv])
    out, _ = capsys.readouterr()
    assert info.value.code == 0 and "memory.max: fits" in out


def test_the_header_cache_serves_a_second_read_without_the_gguf_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from governor.engines import gguf as g

    path = _make(tmp_path, "--quant", "q4_0")
    cache = tmp_path / "cache"
    first = g.read_gguf_cached(path, cache)
    assert first == read_gguf(path)
    assert len(list((cache / "gguf").glob("*.json"))) == 1

    def no_gguf() -> None:
        raise AssertionError("the gguf package was imported on a cache hit")

    monkeypatch.setattr(g, "_gguf_module", no_gguf)
    assert g.read_gguf_cached(path, cache) == first
    # a changed file is another key: parsed again (and the package is needed again)
    path.write_bytes(path.read_bytes() + b"\0" * 4096)
    with pytest.raises(AssertionError, match="imported on a cache hit"):
        g.read_gguf_cached(path, cache)


def test_a_broken_or_unwritable_cache_is_ignored(tmp_path: Path) -> None:
    from governor.engines import gguf as g

    path = _make(tmp_path)
    cache = tmp_path / "cache"
    info = g.read_gguf_cached(path, cache)
    (entry,) = (cache / "gguf").glob("*.json")
    entry.write_text('{"not": "an entry"}')
    assert g.read_gguf_cached(path, cache) == info  # parsed again, entry rewritten
    assert json.loads(entry.read_text())["n_layer"] == info.n_layer
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    assert g.read_gguf_cached(path, blocked) == info  # cannot create blocked/gguf: no cache
    with pytest.raises(PolicyError):  # a corrupt model is never served from the cache
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(path.read_bytes()[:100])
        g.read_gguf_cached(bad, cache)


def _header(kvs: bytes, n_kv: int, n_tensors: int = 0) -> bytes:
    return (
        b"GGUF" + (3).to_bytes(4, "little") + n_tensors.to_bytes(8, "little")
        + n_kv.to_bytes(8, "little") + kvs
    )  # fmt: skip


def _key(name: str) -> bytes:
    return len(name).to_bytes(8, "little") + name.encode()


def test_arrays_nested_a_thousand_deep_are_65_not_a_recursion_error(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    depth = 1100
    nested = b"".join((9).to_bytes(4, "little") + (1).to_bytes(8, "little") for _ in range(depth))
    # type ARRAY of ARRAY of ... (each: item type 9, one item)
    body = _key("x") + (9).to_bytes(4, "little") + nested + (4).to_bytes(4, "little")
    bad = tmp_path / "nested.gguf"
    bad.write_bytes(_header(body + b"\0" * 64, 1))
    with pytest.raises(PolicyError) as err:
        read_gguf(bad)
    assert "nested deeper" in str(err.value)


def test_a_count_the_file_cannot_hold_is_refused_at_once(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    # 2^24 empty strings claimed by a file of a few bytes
    body = _key("x") + (9).to_bytes(4, "little") + (8).to_bytes(4, "little")
    body += (1 << 24).to_bytes(8, "little")
    bad = tmp_path / "count.gguf"
    bad.write_bytes(_header(body + b"\0" * 64, 1))
    with pytest.raises(PolicyError) as err:
        read_gguf(bad)
    assert "implausible array item count" in str(err.value)


def test_a_model_whose_tensor_data_is_cut_off_is_65(tmp_path: Path) -> None:
    good = _make(tmp_path)
    info = read_gguf(good)
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(good.read_bytes()[: info.file_bytes - 4096])
    with pytest.raises(PolicyError) as err:
        read_gguf(bad)
    assert "tensor data cut off" in str(err.value)


@pytest.mark.timeout(60)
def test_a_fifo_as_model_is_refused_not_waited_on(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(PolicyError) as err:
        read_gguf(fifo)  # would block in open() for a writer that never comes
    assert "not a regular file" in str(err.value)


def test_a_split_name_with_no_such_part_is_an_argv_error() -> None:
    from governor.engines.llama import EngineArgvError

    with pytest.raises(EngineArgvError):
        parse_llama_argv(["llama-cli", "-m", "x-00001-of-00000.gguf"])
    with pytest.raises(EngineArgvError):
        parse_llama_argv(["llama-cli", "-c", "9" * 400])


@pytest.mark.parametrize("entry", ['{"tensors": 5}', "[1, 2]", '"text"', '{"tensors": [1]}'])
def test_a_corrupt_header_cache_entry_is_re_read_not_a_traceback(
    tmp_path: Path, entry: str
) -> None:
    from governor.engines import gguf as g

    path = _make(tmp_path)
    cache = tmp_path / "cache"
    info = g.read_gguf_cached(path, cache)
    (cached,) = (cache / "gguf").glob("*.json")
    cached.write_text(entry)
    assert g.read_gguf_cached(path, cache) == info
