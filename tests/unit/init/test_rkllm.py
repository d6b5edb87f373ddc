"""`governor init` for an RKLLM model (issue 45 item 6, governor/init/rkllm.py): the NPU claim
is RKLLM's estimate (engines/rkllm_memory.py) from the parameters and quantisation the file's
name gives, and a second instance that would not fit the NPU's 4 GiB address space beside a
running one is refused with 75, as admission refuses its launch. Needs: fixture hosts, a tmp
run dir (no kernel)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from helpers.cli import run

from governor.engines.rkllm_memory import estimate_bytes
from governor.init.rkllm import name_facts
from governor.plan.model import Plan
from governor.rundir.state import Publisher, applied

REPO = Path(__file__).resolve().parents[3]
RK3588 = str(REPO / "tests/fixtures/hosts/rk3588")
GOLDEN = REPO / "tests/golden/plans/base@rk3588.json"
MIB, GIB = 1 << 20, 1 << 30


@pytest.mark.parametrize(
    ("name", "facts"),
    [
        ("Qwen2.5-1.5B-Instruct_W8A8_RK3588.rkllm", (1_500_000_000, "w8a8")),
        ("DeepSeek-R1-Distill-Qwen-7B_W8A8_RK3588.rkllm", (7_000_000_000, "w8a8")),
        ("smollm-135M_w4a16_g128_rk3576.rkllm", (135_000_000, "w4a16_g128")),
        ("qwen3-0.6b-w4a16.rkllm", (600_000_000, "w4a16")),
        ("Qwen2.5-1.5B-Instruct_RK3588.rkllm", None),  # no quantisation
        ("chat_W8A8_RK3588.rkllm", None),  # no parameters
        ("mix-1.5B-7B_W8A8.rkllm", None),  # two counts: which?
    ],
)
def test_the_files_name_gives_parameters_and_quantisation(
    name: str, facts: tuple[int, str] | None
) -> None:
    assert name_facts(name) == facts


def running_rkllm(tmp_path: Path, name: str, npu: int) -> Path:
    """An applied RKLLM slice named ``name`` holding ``npu`` bytes of NPU memory (it holds
    while its cgroup exists); the run dir."""
    run_dir = tmp_path / "run"
    held = json.loads(GOLDEN.read_text())
    group = f"governor.slice/{name}"
    held.update(policy=name, group=group, leaf=f"{group}/engine", writes=[])
    held["engine"] = {**held["engine"], "kind": "rkllm"}
    held["device"] = {"memory": npu, "pool": "system", "reason": "device.memory"}
    held["cgroup_root"] = str(tmp_path / "cg")
    (tmp_path / "cg" / group).mkdir(parents=True)
    Publisher(run_dir, name).publish(
        applied(Plan.from_dict(held), policy_path=None, created=[], started_at=1.0)
    )
    return run_dir


def test_init_claims_rkllms_estimate_as_device_memory_and_check_accepts_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(tmp_path / "run"))
    model = tmp_path / "Qwen2-0.5B-Instruct_W8A8_RK3588.rkllm"
    model.write_bytes(b"w")
    out = tmp_path / "npu.toml"
    code, said, err = run(capsys, "--root", RK3588, "init", "--model", str(model), "-o", str(out))
    assert code == 0, err
    est = estimate_bytes(500_000_000, "w8a8")
    assert est is not None
    policy = tomllib.loads(out.read_text())
    assert policy["engine"] == {"kind": "rkllm", "max_context_tokens": 2048}
    assert policy["device"]["memory"] == f"{-(-est // MIB)}MiB"
    assert said.splitlines()[0].startswith(
        f"wrote {out}: MAX_CONTEXT_LEN 2048, device memory {est >> 20} MiB (RKLLM's estimate"
        " for 0.50B parameters at w8a8"
    ), said
    engine = said.splitlines()[1].split("--engine-argv ", 1)[1].strip("'")
    assert engine == f"llm_demo {model} 512 2048"
    code, _, err = run(capsys, "--root", RK3588, "check", str(out), "--engine-argv", engine)
    assert code == 0, err


def test_init_refuses_a_second_rkllm_instance_that_would_not_fit_the_npu_with_75(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(running_rkllm(tmp_path, "npu-a", 3 * GIB)))
    big = tmp_path / "Llama-3.2-1B-Instruct_W8A8_RK3588.rkllm"  # 1210 MiB: fits the pool
    big.write_bytes(b"w")
    out = tmp_path / "npu-b.toml"
    argv = ("--root", RK3588, "init", "--name", "npu-b", "-o", str(out))
    code, _, err = run(capsys, *argv, "--model", str(big))
    assert code == 75, err
    assert err.splitlines()[0].startswith(
        "governor: npu-b needs 1210 MiB of NPU memory beside the running RKLLM instance(s)"
        " (npu-a 3072 MiB): 4282 MiB is above the NPU's 4 GiB address space"
    ), err
    assert err.splitlines()[1].startswith("hint: ") and not out.exists()  # nothing written
    small = tmp_path / "Qwen2-0.5B-Instruct_W8A8_RK3588.rkllm"  # 0.6 GiB: fits beside it
    small.write_bytes(b"w")
    code, _, err = run(capsys, *argv, "--model", str(small))
    assert code == 0, err
    assert "running RKLLM instances: npu-a 3072 MiB" in out.read_text()
    # the same name replaces its own claim: npu-a's own init is no second instance
    code, _, err = run(capsys, *argv[:3], "--name", "npu-a", "--model", str(big), "--force")
    assert code == 0, err


def test_a_name_without_parameters_claims_the_files_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(tmp_path / "run"))
    model = tmp_path / "chat.rkllm"
    model.write_bytes(b"w" * (3 * MIB + 1))
    code, out, err = run(capsys, "--root", RK3588, "init", "--model", str(model))
    assert code == 0, err
    assert tomllib.loads(out)["device"]["memory"] == "4MiB"
    assert "the .rkllm file's size" in out


def test_init_refuses_what_check_would_a_claim_above_the_boards_pool_now(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixture board has 1508 MiB available: a 1.5B model's 1728 MiB claim does not fit its
    system pool. init refuses with check's line and writes nothing; --board-memory (an empty
    board of that size) drafts it."""
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(tmp_path / "run"))
    big = tmp_path / "Qwen2.5-1.5B-Instruct_W8A8_RK3588.rkllm"
    big.write_bytes(b"w")
    out = tmp_path / "npu.toml"
    code, _, err = run(capsys, "--root", RK3588, "init", "--model", str(big), "-o", str(out))
    assert code == 65, err
    assert err.startswith("governor: device memory 1.69GiB (1811939328 bytes)"), err
    assert "does not fit what the board can give: MemAvailable" in err.splitlines()[0], err
    assert err.splitlines()[1].startswith("hint: ") and not out.exists()
    code, _, err = run(capsys, "--root", RK3588, "init", "--model", str(big), "-o", str(out),
                       "--board-memory", "4G")  # fmt: skip
    assert code == 0, err
