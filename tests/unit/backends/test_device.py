"""[device] end to end on the compile side and the board check (governor/backends/device.py,
engines/rkllm.py, the `device memory` rule): pure functions and the rk3588 fixture tree (its
meminfo has CMA). Needs: nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from governor.backends.device import check_device, fit_device, others_protection
from governor.compile.compiler import Workload, _watch_trigger, compile_plan, watch_rule
from governor.engines.rkllm import check_rkllm, parse_rkllm_argv
from governor.errors import PolicyError, PolicyNotFound
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.monitor.rules import Observations, Rule, RuleEngine
from governor.plan.host import probe
from governor.plan.model import DeviceSpec, Plan, WatchCondition
from governor.policy import values as v
from governor.policy.loader import load_text

REPO = Path(__file__).resolve().parents[3]
RK3588 = REPO / "tests" / "fixtures" / "hosts" / "rk3588"
MIB = 1 << 20


def _plan(text: str, model_bytes: int | None = None) -> Plan:
    policy = load_text('name = "npu"\n' + text, source="npu.toml")
    host = probe(RK3588, target="governor.slice/npu")
    return compile_plan(policy, host, workload=Workload(model_bytes=model_bytes), source="npu.toml")


# ---------------------------------------------------------------- policy -> plan


def test_device_memory_compiles_to_bytes_and_round_trips() -> None:
    plan = _plan('[device]\nmemory = "1.2GiB"\n')
    assert plan.device == DeviceSpec(memory=int(1.2 * (1 << 30)), pool="system")
    assert Plan.from_json(plan.to_json()).device == plan.device


def test_a_plan_without_device_keeps_its_json_shape() -> None:
    assert "device" not in _plan("").to_dict()


def test_rkllm_engine_counts_its_model_file_as_device_memory() -> None:
    plan = _plan('[engine]\nkind = "rkllm"\n', model_bytes=900 * MIB)
    assert plan.device is not None and plan.device.memory == 900 * MIB
    assert "rkllm" in plan.device.reason
    assert _plan('[engine]\nkind = "rkllm"\n').device == DeviceSpec(
        memory="model", reason="engine.kind = rkllm (the .rkllm file)"
    )


def test_device_pool_is_checked_by_the_schema() -> None:
    with pytest.raises(PolicyError, match="pool"):
        _plan('[device]\npool = "vram"\n')


def test_device_rule_parses_and_compiles() -> None:
    cond = v.parse_condition("device memory > 1.5G")
    assert cond == v.DeviceMemoryCondition(int(1.5 * (1 << 30)))
    assert v.parse_condition(str(cond)) == cond
    w = _watch_trigger(cond)
    assert isinstance(w, WatchCondition) and w.condition == "device"
    with pytest.raises(ValueError, match="form"):
        v.parse_condition("device memory < 1G")


def test_device_rule_fires_once_per_episode_above_its_threshold() -> None:
    trigger = WatchCondition(condition="device", threshold=100 * MIB, file="/proc/PID/fdinfo")
    rule = Rule.from_watch(watch_rule(0, trigger, ("log",)))
    assert rule.kind == "device"
    eng = RuleEngine([rule])
    seen = [50, 120, 130, None, 90, 150]
    fired = [
        [f.value for f in eng.step(float(t), Observations(device=None if m is None else m * MIB))]
        for t, m in enumerate(seen)
    ]
    assert fired == [[], [120 * MIB], [], [], [], [150 * MIB]]


# ---------------------------------------------------------------- the board check


def test_fit_uses_memavailable_minus_the_other_groups_protection() -> None:
    meminfo = {"MemAvailable": 1000 * MIB}
    assert fit_device(600 * MIB, "system", meminfo, 300 * MIB) == 700 * MIB
    with pytest.raises(PolicyError, match=r"MemAvailable .* minus 500MiB") as err:
        fit_device(600 * MIB, "system", meminfo, 500 * MIB)
    assert err.value.field == "device.memory"


def test_cma_pool_needs_cma() -> None:
    assert fit_device(100 * MIB, "cma", {"CmaTotal": 256 * MIB, "CmaFree": 200 * MIB}, 0)
    with pytest.raises(PolicyError, match="no CMA"):
        fit_device(1, "cma", {"MemAvailable": 1 << 30}, 0)
    with pytest.raises(PolicyError, match="CmaFree"):
        fit_device(300 * MIB, "cma", {"CmaTotal": 256 * MIB, "CmaFree": 200 * MIB}, 0)


def _board(tmp_path: Path, sibling_min: int) -> tuple[CgroupFs, ProcFs]:
    proc = tmp_path / "proc"
    shutil.copytree(RK3588 / "proc", proc)
    cg = tmp_path / "cg"
    for group, low in (("governor.slice/npu", 0), ("governor.slice/chat", sibling_min)):
        (cg / group).mkdir(parents=True)
        (cg / group / "memory.min").write_text(f"{low}\n")
    return CgroupFs(cg), ProcFs(proc)


def test_check_device_on_the_rk3588_board(tmp_path: Path) -> None:
    fs, proc = _board(tmp_path, sibling_min=512 * MIB)
    assert others_protection(fs, _plan("")) == 512 * MIB
    avail = proc.meminfo()["MemAvailable"]  # 1544716 kB in the fixture
    ok = _plan(f"[device]\nmemory = {avail - 600 * MIB}\n")
    assert check_device(ok, fs, proc) == avail - 512 * MIB
    too_big = _plan(f"[device]\nmemory = {avail - 400 * MIB}\n")
    with pytest.raises(PolicyError, match=r"device memory .* does not fit"):
        check_device(too_big, fs, proc)
    cma = _plan('[device]\nmemory = "200MiB"\npool = "cma"\n')
    assert check_device(cma, fs, proc) == proc.meminfo()["CmaFree"]
    assert check_device(_plan(""), fs, proc) is None


def test_check_device_without_the_model_size_refuses(tmp_path: Path) -> None:
    fs, proc = _board(tmp_path, sibling_min=0)
    with pytest.raises(PolicyError, match='"model" needs'):
        check_device(_plan('[engine]\nkind = "rkllm"\n'), fs, proc)


# ---------------------------------------------------------------- rkllm argv


def test_rkllm_argv_is_positional(tmp_path: Path) -> None:
    model = tmp_path / "qwen.rkllm"
    model.write_bytes(b"\0" * 4096)
    args = parse_rkllm_argv(["llm_demo", str(model), "256", "2048"])
    assert (args.model, args.max_new_tokens, args.max_context_len) == (model, 256, 2048)
    assert check_rkllm(["llm_demo", str(model), "256", "2048"], 4096) == (model, 4096)
    with pytest.raises(PolicyError, match=r"exceeds engine\.max_context_tokens = 1024"):
        check_rkllm(["llm_demo", str(model), "256", "2048"], 1024)
    with pytest.raises(PolicyError, match="MAX_NEW_TOKENS must be a positive integer"):
        parse_rkllm_argv(["llm_demo", str(model), "many"])
    with pytest.raises(PolicyError, match="needs its model"):
        parse_rkllm_argv(["llm_demo"])
    with pytest.raises(PolicyNotFound, match="model file not found"):
        check_rkllm(["llm_demo", str(tmp_path / "nope.rkllm"), "1", "2"], None)
