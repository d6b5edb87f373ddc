"""[clocks] at compile time (governor/policy/clocks.py, governor/compile/clocks.py): the keys
resolved on the rk3588 fixture board, every value checked against the board's lists (65
naming clocks.<key>), and the writes in `governor plan`.

Needs: the rk3588 host fixture (its cpufreq and devfreq trees)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.clocks import DMC, FIXTURE_SYS, NPU, POLICY0, POLICY4, POLICY6

from governor.compile.compiler import compile_plan
from governor.errors import PolicyError
from governor.plan.host import HostFacts, probe
from governor.plan.model import Plan
from governor.plan.render import plan_table
from governor.policy.loader import load_text

RK3588 = FIXTURE_SYS.parent


@pytest.fixture(scope="module")
def board() -> HostFacts:
    return probe(RK3588)


def _plan(body: str, host: HostFacts) -> Plan:
    policy = load_text(f'name = "clk"\n[clocks]\n{body}\n', source="clk.toml")
    return compile_plan(policy, host, source="clk.toml")


def _writes(plan: Plan) -> list[tuple[str, str, str]]:
    return [
        (str(Path(t.path).relative_to(FIXTURE_SYS)), w.file, w.value)
        for t in plan.clocks
        for w in t.writes
    ]


def test_big_is_both_a76_clusters_little_the_a55_one(board: HostFacts) -> None:
    plan = _plan('big = { governor = "userspace", min = "max" }\nlittle = "powersave"', board)
    assert _writes(plan) == [
        (POLICY4, "scaling_governor", "userspace"),
        (POLICY4, "scaling_min_freq", "2352000"),
        (POLICY6, "scaling_governor", "userspace"),
        (POLICY6, "scaling_min_freq", "2352000"),
        (POLICY0, "scaling_governor", "powersave"),
    ]
    assert [t.key for t in plan.clocks] == ["big", "big", "little"]
    assert "clocks.big -> cpufreq policy4 (cpus 4-5), policy6 (cpus 6-7)" in plan.notes
    assert plan.clocks[0].writes[1].reason == "clocks.big.min"


def test_devfreq_keys_are_found_by_name_and_compatible(board: HostFacts) -> None:
    plan = _plan(
        'dmc = "performance"\nnpu = { min = "1GHz" }\n'
        'gpu = { governor = "userspace", freq = "800MHz" }',
        board,
    )
    assert {(t.key, t.name) for t in plan.clocks} == {
        ("npu", "fdab0000.npu"),
        ("gpu", "fb000000.gpu"),
        ("dmc", "dmc"),
    }
    writes = {(t.key, w.file, w.value) for t in plan.clocks for w in t.writes}
    assert writes == {
        ("dmc", "governor", "performance"),
        ("npu", "min_freq", "1000000000"),
        ("gpu", "governor", "userspace"),
        ("gpu", "userspace/set_freq", "800000000"),
    }


def test_a_gpu_named_otherwise_is_found_by_its_compatible(tmp_path: Path) -> None:
    root = tmp_path / "rk"
    shutil.copytree(RK3588, root, symlinks=True)
    link = root / "sys/class/devfreq/fb000000.gpu"
    link.rename(root / "sys/class/devfreq/gpu0")
    (root / "sys/devices/platform/fb000000.gpu/devfreq/fb000000.gpu/name").write_text("gpu0\n")
    plan = _plan('gpu = "performance"', probe(root))
    assert [t.name for t in plan.clocks] == ["gpu0"]  # compatible arm,mali-bifrost


def test_plan_output_lists_every_clock_write(board: HostFacts) -> None:
    text = plan_table(_plan('dmc = { governor = "userspace", freq = "max" }', board))
    dmc = FIXTURE_SYS / DMC
    assert f"clock    {dmc}/governor = userspace  (clocks.dmc.governor)" in text
    assert f"clock    {dmc}/userspace/set_freq = 2112000000  (clocks.dmc.freq)" in text


def test_clocks_round_trip_through_the_plan_json(board: HostFacts) -> None:
    plan = _plan('big = { min = "1.8GHz", max = "max" }', board)
    assert Plan.from_json(plan.to_json()) == plan
    assert "clocks" not in _plan("", board).to_dict()  # plans without [clocks] read as before


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ("big = { min = 2400000 }", "clocks.big.min", "not an available frequency of cpufreq"),
        ('npu = "turbo"', "clocks.npu.governor", "'turbo' is not available on devfreq"),
        ('dmc = { min = "1GHz" }', "clocks.dmc.min", "1000000000Hz is not an available"),
        ('gpu = { min = "max", max = "min" }', "clocks.gpu", "min 1000000000 is above max"),
    ],
)
def test_what_the_board_cannot_do_is_refused_naming_the_field(
    board: HostFacts, body: str, field: str, says: str
) -> None:
    with pytest.raises(PolicyError) as err:
        _plan(body, board)
    assert err.value.exit_code == 65
    assert err.value.field == field
    assert says in str(err.value)
    assert str(err.value).endswith(f"(clk.toml, {field})")


def test_a_board_without_the_device_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "rk"
    shutil.copytree(RK3588, root, symlinks=True)
    (root / "sys/class/devfreq/dmc").unlink()  # old firmware: no DMC devfreq
    with pytest.raises(PolicyError, match="no dmc devfreq device") as err:
        _plan('dmc = "performance"', probe(root))
    assert "firmware" in (err.value.hint or "")
    with pytest.raises(PolicyError, match="no cpufreq policies"):
        _plan('big = "performance"', probe(RK3588, sysfs_root=tmp_path / "empty"))


def test_a_board_with_one_core_type_has_no_big_cluster(tmp_path: Path) -> None:
    root = tmp_path / "rk"
    shutil.copytree(RK3588, root, symlinks=True)
    for cap in (root / "sys/devices/system/cpu").glob("cpu*/cpu_capacity"):
        cap.write_text("1024\n")
    with pytest.raises(PolicyError, match="no distinct core types") as err:
        _plan('little = "powersave"', probe(root))
    assert err.value.field == "clocks.little"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('dmc = { freq = "max" }', 'freq needs governor = "userspace"'),
        ("big = {}", "an empty clock table"),
        ('npu = { min = "fast" }', 'expected "max", "min"'),
        ('npu = { min = "1.5" }', 'expected "max", "min"'),
        ('cpu = "performance"', "unknown key"),
        ('big = { governor = "Perf ormance" }', "invalid governor name"),
        ("dmc = true", "dmc"),
    ],
)
def test_the_policy_language_refuses_malformed_clocks(body: str, says: str) -> None:
    with pytest.raises(PolicyError, match=says) as err:
        load_text(f'name = "clk"\n[clocks]\n{body}\n', source="clk.toml")
    assert err.value.exit_code == 65
    assert (err.value.field or "").startswith("clocks.")


@pytest.mark.parametrize(
    ("device", "file", "body", "field"),
    [
        (DMC, "min_freq", 'dmc = { min = "max" }', "clocks.dmc.min"),
        (NPU, "max_freq", 'npu = { max = "max" }', "clocks.npu.max"),
        (POLICY4, "scaling_max_freq", 'big = { max = "min" }', "clocks.big.max"),
        (POLICY0, "scaling_governor", 'little = "performance"', "clocks.little.governor"),
    ],
)
def test_a_key_whose_device_lacks_the_role_file_is_refused_naming_it(
    tmp_path: Path, device: str, file: str, body: str, field: str
) -> None:
    root = tmp_path / "rk3588"
    shutil.copytree(RK3588, root, symlinks=True)
    (root / "sys" / device / file).unlink(missing_ok=True)
    with pytest.raises(PolicyError) as err:
        _plan(body, probe(root))
    assert err.value.exit_code == 65 and err.value.field == field
    assert f"has no {file} file" in str(err.value)


def test_userspace_with_freq_needs_no_setspeed_file_before_the_governor_runs(
    board: HostFacts,
) -> None:
    plan = _plan('big = { governor = "userspace", freq = "max" }', board)
    assert ("scaling_setspeed", "2352000") in [(w.file, w.value) for w in plan.clocks[0].writes]
