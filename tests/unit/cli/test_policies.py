"""The example policies in policies/: each passes `governor check` against the RK3588 board
fixture (the board they are written for), and the derived ones extend base.toml.

Needs: the rk3588 host fixture tree.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from governor.cli.app import main

REPO = Path(__file__).resolve().parents[3]
POLICY_DIR = REPO / "policies"
RK3588 = REPO / "tests" / "fixtures" / "hosts" / "rk3588"
EXAMPLES = sorted(POLICY_DIR.glob("*.toml"))


def test_the_documented_example_policies_exist() -> None:
    assert {"base.toml", "npu-chat.toml", "npu-batch.toml"} <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_policy_passes_governor_check_on_rk3588(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--root", str(RK3588), "check", str(path)])
    out, err = capsys.readouterr()
    assert info.value.code == 0, err
    assert out.startswith(f"{path}: ok (")
    assert "NOT in force" not in out


@pytest.mark.parametrize("name", ["npu-chat.toml", "npu-batch.toml"])
def test_derived_example_policy_extends_base(name: str) -> None:
    raw = tomllib.loads((POLICY_DIR / name).read_text(encoding="utf-8"))
    assert raw["extends"] == "base.toml"
    assert raw["name"] == name.removesuffix(".toml")


def test_npu_chat_rkllm_block_compiles_and_budgets_the_model_as_device_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """npu-chat.toml's commented RKLLM block, swapped in for its [engine] and [prefetch]."""
    import shutil

    import tomlkit

    text = (POLICY_DIR / "npu-chat.toml").read_text(encoding="utf-8")
    block = text.split("# BEGIN rkllm\n")[1].split("# END rkllm")[0]
    swap = tomllib.loads(
        "\n".join(line.removeprefix("#").removeprefix(" ") for line in block.splitlines())
    )
    policy = tomllib.loads(text)
    policy.update(engine=swap["engine"], prefetch=swap["prefetch"], device=swap["device"])
    policy["pressure"] = [*policy["pressure"], *swap["pressure"]]
    shutil.copy(POLICY_DIR / "base.toml", tmp_path / "base.toml")
    path = tmp_path / "npu-chat.toml"
    path.write_text(tomlkit.dumps(policy))
    model = tmp_path / "qwen.rkllm"
    with model.open("wb") as f:
        f.truncate(900 << 20)
    argv = f"llm_demo {model} 256 2048"
    with pytest.raises(SystemExit) as info:
        main(["--root", str(RK3588), "check", str(path), "--engine-argv", argv])
    out, err = capsys.readouterr()
    assert info.value.code == 0, err
    with pytest.raises(SystemExit) as info:
        main(["--root", str(RK3588), "plan", str(path), "--json"])
    out, err = capsys.readouterr()
    assert info.value.code == 0, err
    import json

    plan = json.loads(out)
    assert plan["device"]["reason"] == "engine.kind = rkllm (the .rkllm file)"
    assert plan["watch"][-1]["when"] == "device memory > 1.5GiB"
