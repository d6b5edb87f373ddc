"""RKLLM's memory (issue 45 item 6, governor/engines/rkllm_memory.py): the estimate against
Rockchip's published RK3588 table, the runtime's reported memory, the NPU domain. Pure."""

from __future__ import annotations

import pytest

from governor.board.npu import NPU_DOMAIN_BYTES, npu_refusal
from governor.engines.rkllm_memory import estimate_bytes, parse_memory_usage

MB = 1 << 20
# airockchip/rknn-llm benchmark.md (RKLLM 1.3.0), RK3588, w8a8, seqlen 128: memory(MB), with
# each model's exact parameter count (its config); rows whose count the table leaves open
# (MiniCPM4-0.5B, RWKV7, Gemma3n, TeleChat2, the VL/OCR/Qwen3.5/Gemma4 rows) are left out
RK3588_W8A8 = [
    ("Qwen2-0.5B", 494_032_768, 669.56),
    ("Qwen3-0.6B", 596_049_920, 791.11),
    ("TinyLLAMA-1.1B", 1_100_048_384, 1093.66),
    ("Qwen2.5-1.5B", 1_543_714_304, 1689.21),
    ("InternLM2-1.8B", 1_889_110_016, 1775.56),
    ("Gemma2-2B", 2_614_341_888, 2779.22),
    ("Phi3-3.8B", 3_821_079_552, 3758.34),
    ("MiniCPM3-4B", 4_070_000_000, 4384.02),
    ("ChatGLM3-6B", 6_243_584_000, 5985.99),
]


# rows no estimate from the parameter count can hold within +10 % once it is never under
# (governor/engines/rkllm_memory.py says why), with the most over they may be
BEYOND_THE_BAND = {"TinyLLAMA-1.1B": 0.21, "InternLM2-1.8B": 0.21, "ChatGLM3-6B": 0.11}


@pytest.mark.parametrize(("model", "params", "table_mb"), RK3588_W8A8)
def test_the_estimate_is_never_under_rockchips_rk3588_table_and_at_most_10_percent_over(
    model: str, params: int, table_mb: float
) -> None:
    got = estimate_bytes(params, "w8a8")
    assert got is not None
    over = got / (table_mb * MB) - 1
    assert 0 <= over <= BEYOND_THE_BAND.get(model, 0.10), (model, got / MB, table_mb)
    assert (over > 0.10) == (model in BEYOND_THE_BAND), (model, f"{over:+.1%}")


def test_an_unknown_dtype_has_no_estimate() -> None:
    assert estimate_bytes(1_000_000_000, "w2a2") is None
    assert estimate_bytes(0, "w8a8") is None
    assert estimate_bytes(1_000_000_000, "W8A8") == estimate_bytes(1_000_000_000, "w8a8")


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("prefill_time_ms: 243.9\nmemory_usage_mb: 1093.66\n", 1093.66),
        ("memory_usage_mb = 12.5\nmemory_usage_mb = 700\n", 700),  # the last report
        ("I rkllm:  Peak Memory Usage (GB)\nI rkllm:  1.07\n", 1.07 * 1024),
        ("I rkllm: rkllm-runtime version: 1.3.0\n", None),
    ],
)
def test_the_runtimes_reported_memory_is_read(text: str, mb: float | None) -> None:
    got = parse_memory_usage(text)
    assert got == (None if mb is None else int(mb * MB))


def test_a_second_instance_beyond_the_npu_domain_is_refused() -> None:
    four_b = 4_022_272_000  # Qwen3-4B w8a8: what rknpu failed to map (rknn-llm issue 437)
    said = npu_refusal("chat2", four_b, [("chat", four_b)])
    assert said is not None and "above the NPU's 4 GiB address space" in said
    assert "chat 3835 MiB" in said
    small = 1_800 * MB  # two Qwen3-1.7B fit, a third does not (issue 437)
    assert npu_refusal("b", small, [("a", small)]) is None
    assert npu_refusal("c", small, [("a", small), ("b", small)]) is not None
    assert npu_refusal("alone", NPU_DOMAIN_BYTES * 2, []) is None  # alone: device.memory says


def _rkllm_plan(name: str, device: int) -> dict[str, object]:
    import json
    from pathlib import Path

    golden = Path(__file__).resolve().parents[2] / "golden/plans/base@rk3588.json"
    plan: dict[str, object] = json.loads(golden.read_text())
    group = f"governor.slice/{name}"
    plan.update(policy=name, group=group, leaf=f"{group}/engine", writes=[])
    plan["engine"] = {**plan["engine"], "kind": "rkllm"}  # type: ignore[dict-item]
    plan["device"] = {"memory": device, "pool": "system", "reason": "device.memory"}
    return plan


def test_admission_refuses_a_second_rkllm_instance_beyond_the_npu_domain_with_75(
    tmp_path: object,
) -> None:
    from pathlib import Path

    from governor.api.admit import npu_admission
    from governor.errors import EXIT_TEMPFAIL, AdmissionRefused
    from governor.plan.model import Plan
    from governor.rundir.state import Publisher, applied

    assert isinstance(tmp_path, Path)
    run, root = tmp_path / "run", tmp_path / "root"
    run.mkdir()
    (root / "proc/1").mkdir(parents=True)
    (root / "proc/1/cmdline").write_bytes(b"python\0-m\0governor\0launch\0")
    four_b = 4_022_272_000
    first = applied(Plan.from_dict(_rkllm_plan("chat", four_b)), policy_path=None, created=[],
                    started_at=1.0).to_json()  # fmt: skip
    first.update(source="launch", pid=1)
    Publisher(run, "chat").publish(first)
    second = Plan.from_dict(_rkllm_plan("chat2", four_b))
    with pytest.raises(AdmissionRefused) as info:
        npu_admission(second, run, root)
    assert info.value.exit_code == EXIT_TEMPFAIL == 75
    assert "beside the running RKLLM instance(s) (chat 3835 MiB)" in str(info.value)
    npu_admission(Plan.from_dict(_rkllm_plan("chat2", 100 * MB)), run, root)  # fits: no error
    npu_admission(Plan.from_dict(_rkllm_plan("chat", four_b)), run, root)  # its own old state
    (root / "proc/1/cmdline").write_bytes(b"sleep\0")  # the first is gone (stale): it fits
    npu_admission(second, run, root)
