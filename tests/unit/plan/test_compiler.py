"""The pure compiler (governor/compile/compiler.py): golden Plans for policies/*.toml on the fixture
hosts, host problems (HostError 69 listing every one), --allow-missing degradation, resolution of
percentages, "big"/"little" and "model", page rounding, write order, and purity (no I/O, env or
clock while compiling).

Needs: the host fixture trees (tests/fixtures/hosts) and the example policies (policies/).
Regenerate the goldens with GOVERNOR_UPDATE_GOLDEN=1 after an intended change, and review the diff.
"""

from __future__ import annotations

import builtins
import os
import pathlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest
from helpers.golden import update_requested
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.compile.compiler import (
    MEMLOCK_MODEL_MARGIN,
    MEMORY_MIN_MODEL_MARGIN,
    Workload,
    compile_plan,
)
from governor.errors import HostError, PolicyError
from governor.kernel import files as kf
from governor.plan.host import CgroupLevel, HostFacts, probe
from governor.plan.model import EnableControllers, Plan, WatchTrigger
from governor.policy import values as v
from governor.policy.loader import load, load_text
from governor.policy.model import Policy
from governor.record import replace

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
POLICY_DIR = REPO / "policies"
GOLDEN = REPO / "tests" / "golden" / "plans"
MIB, GIB = 1 << 20, 1 << 30

EXAMPLE_POLICIES = sorted(p.stem for p in POLICY_DIR.glob("*.toml"))
HOST_NAMES = ["cgroup2-full", "hybrid-host", "no-psi", "old-big-little", "rk3588"]
# every example policy on every fixture host: a Plan (.json) where it compiles, else the error
# (.err) that `governor check` would print
GOLDEN_CASES = [(p, h) for p in EXAMPLE_POLICIES for h in HOST_NAMES]


def _host(name: str, policy: Policy | None = None) -> HostFacts:
    target = f"{policy.slice}/{policy.name}" if policy is not None else None
    return probe(HOSTS / name, target=target)


def _policy(text: str) -> Policy:
    return load_text(text, source="test.toml")


def _compile(
    text: str,
    host: str | HostFacts = "rk3588",
    *,
    workload: Workload | None = None,
    allow: frozenset[str] = frozenset(),
) -> Plan:
    facts = _host(host) if isinstance(host, str) else host
    return compile_plan(
        _policy(text), facts, workload=workload, allow_missing=allow, source="test.toml"
    )


def _host_error(text: str, host: str | HostFacts, allow: frozenset[str] = frozenset()) -> HostError:
    with pytest.raises(HostError) as info:
        _compile(text, host, allow=allow)
    return info.value


def _value(plan: Plan, file: str) -> str:
    (write,) = [w for w in plan.writes if w.file == file]
    return write.value


# ---------------------------------------------------------------- goldens


def _golden_text(policy: str, host: str) -> tuple[str, str]:
    """(suffix, text) of the golden for one policy on one host."""
    loaded = load(POLICY_DIR / f"{policy}.toml")
    root = HOSTS / host
    facts = probe(root, target=f"{loaded.slice}/{loaded.name}")
    try:
        plan = compile_plan(loaded, facts, source=f"policies/{policy}.toml")
    except (HostError, PolicyError) as err:
        text = f"exit {err.exit_code}\ngovernor: {err}\nhint: {err.hint}\n"
        suffix = ".err"
    else:
        text = plan.to_json() + "\n"
        suffix = ".json"
    # fixture roots are absolute paths of this checkout: make the golden position-independent
    return suffix, text.replace(str(root), "<root>")


@pytest.mark.parametrize(
    ("policy", "host"), GOLDEN_CASES, ids=[f"{p}@{h}" for p, h in GOLDEN_CASES]
)
def test_example_policy_on_fixture_host_matches_its_golden(policy: str, host: str) -> None:
    suffix, text = _golden_text(policy, host)
    golden = GOLDEN / f"{policy}@{host}{suffix}"
    if update_requested():
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for stale in GOLDEN.glob(f"{policy}@{host}.*"):
            stale.unlink()
        golden.write_text(text)
    assert golden.exists(), f"missing {golden}; run with GOVERNOR_UPDATE_GOLDEN=1 and review"
    assert text == golden.read_text(), f"{golden} is stale; rerun with GOVERNOR_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("policy", ["base", "npu-chat", "npu-batch"])
def test_example_policies_compile_on_the_rk3588_board(policy: str) -> None:
    """The board the examples are written for: each compiles (a Plan, not an error) and the
    Plan is the reviewed golden."""
    suffix, text = _golden_text(policy, "rk3588")
    assert suffix == ".json", f"{policy} does not compile on the rk3588 board:\n{text}"
    assert text == (GOLDEN / f"{policy}@rk3588.json").read_text()


def test_golden_plan_parses_back_into_the_same_plan() -> None:
    root = HOSTS / "rk3588"
    policy = load(POLICY_DIR / "npu-chat.toml")
    plan = compile_plan(
        policy, probe(root, target="governor.slice/npu-chat"), source="policies/npu-chat.toml"
    )
    text = (GOLDEN / "npu-chat@rk3588.json").read_text().replace("<root>", str(root))
    assert Plan.from_json(text) == plan


def test_every_golden_file_has_a_case() -> None:
    expected = {f"{p}@{h}" for p, h in GOLDEN_CASES}
    found = [p.name.rsplit(".", 1)[0] for p in GOLDEN.iterdir()]
    assert sorted(found) == sorted(expected)


def test_npu_chat_on_rk3588_protects_limits_and_pins_big_cores() -> None:
    policy = load(POLICY_DIR / "npu-chat.toml")
    plan = compile_plan(policy, _host("rk3588", policy))
    assert plan.group == "governor.slice/npu-chat"
    assert plan.leaf == "governor.slice/npu-chat/engine"
    assert plan.create == (
        "governor.slice",
        "governor.slice/npu-chat",
        "governor.slice/npu-chat/engine",
    )
    assert _value(plan, kf.CPUSET_CPUS) == "4-7"
    assert plan.launch.affinity == (4, 5, 6, 7)
    assert _value(plan, kf.MEMORY_MIN) == str(1181116006 // 4096 * 4096)
    assert _value(plan, kf.CPU_MAX) == "350000 100000"
    assert plan.launch.memlock == "model"  # no workload given: resolved at launch
    assert [
        w.trigger.trigger_text() for w in plan.watch if isinstance(w.trigger, WatchTrigger)
    ] == [
        "some 100000 1000000",  # the board's: shed the background first (issue 23)
        "some 150000 2000000",
        "full 500000 2000000",
        "full 1000000 2000000",
        "full 1500000 2000000",
    ]
    assert plan.watch[0].when == "board memory some 100ms/1s"
    assert isinstance(plan.watch[0].trigger, WatchTrigger) and plan.watch[0].trigger.system
    assert [str(a) for a in plan.watch[0].actions] == ["log", "shed"]
    assert plan.watch[1].when == "board available < 200MiB"
    assert plan.qos.qos_class == "interactive"
    assert [str(a) for a in plan.watch[3].actions] == ["log", "set memory.high -10%"]
    assert "cpu.cpus = big -> 4-7 (from cpu_capacity)" in plan.notes
    assert plan.degraded == ()


def test_npu_batch_on_rk3588_runs_on_little_cores() -> None:
    policy = load(POLICY_DIR / "npu-batch.toml")
    plan = compile_plan(policy, _host("rk3588", policy))
    assert _value(plan, kf.CPUSET_CPUS) == "0-3"
    assert _value(plan, kf.IO_WEIGHT) == "default 50"
    assert _value(plan, kf.CPU_WEIGHT) == "50"


# ---------------------------------------------------------------- write order and layout


def test_writes_are_ordered_pids_memory_io_cpu_cpuset() -> None:
    policy = load(POLICY_DIR / "npu-batch.toml")
    plan = compile_plan(policy, _host("rk3588", policy))
    controllers = [w.controller for w in plan.writes]
    assert list(dict.fromkeys(controllers)) == ["pids", "memory", "io", "cpu", "cpuset"]
    assert plan.controllers == ("pids", "memory", "io", "cpu", "cpuset")
    assert [w.file for w in plan.writes] == [
        "pids.max",
        "memory.oom.group",
        "memory.swap.max",
        "memory.high",
        "memory.max",
        "io.weight",
        "cpu.weight",
        "cpu.max",
        "cpuset.cpus",
    ]


def test_memory_writes_put_oom_group_first_and_protection_before_limits() -> None:
    plan = _compile(
        "name = 'm'\n[memory]\nmax = '1GiB'\nhigh = '800M'\nlow = '200M'\nmin = '100M'\n"
        "swap_max = 0\noom_group = false\n"
    )
    assert [w.file for w in plan.writes] == [
        "memory.oom.group",
        "memory.swap.max",
        "memory.min",
        "memory.low",
        "memory.high",
        "memory.max",
    ]
    assert _value(plan, kf.MEMORY_OOM_GROUP) == "0"


def test_every_write_names_its_policy_field_and_the_group() -> None:
    policy = load(POLICY_DIR / "npu-chat.toml")
    plan = compile_plan(policy, _host("rk3588", policy))
    assert {w.cgroup for w in plan.writes} == {plan.group}
    reasons = {w.file: w.reason for w in plan.writes}
    assert reasons["memory.swap.max"] == "memory.swap_max"
    assert reasons["memory.oom.group"] == "memory.oom_group"
    assert reasons["cpuset.cpus"] == "cpu.cpus"
    for w in plan.writes:
        assert w.controller == kf.controller_of(w.file)


def test_controllers_are_enabled_in_the_root_and_the_slice() -> None:
    plan = _compile("name = 'e'\nslice = 'llm.slice'\n[cpu]\nweight = 200\n[pids]\nmax = 64\n")
    assert plan.enable == (
        EnableControllers(cgroup="", controllers=("pids", "cpu")),
        EnableControllers(cgroup="llm.slice", controllers=("pids", "cpu")),
    )
    assert plan.create == ("llm.slice", "llm.slice/e", "llm.slice/e/engine")


def test_policy_without_limits_enables_nothing() -> None:
    plan = _compile("name = 'empty'\n")
    assert plan.writes == ()
    assert plan.enable == ()
    assert plan.controllers == ()


def test_pids_max_string_and_io_weight_take_kernel_spelling() -> None:
    plan = _compile("name = 'p'\n[pids]\nmax = 'max'\n[io]\nweight = 300\n")
    assert _value(plan, kf.PIDS_MAX) == "max"
    assert _value(plan, kf.IO_WEIGHT) == "default 300"


# ---------------------------------------------------------------- memory resolution


def test_memory_percent_is_resolved_against_memtotal_and_page_floored() -> None:
    host = _host("rk3588")
    plan = _compile("name = 'pct'\n[memory]\nhigh = '70%'\n", host)
    expected = host.mem_total * 70 // 100 // host.page_size * host.page_size
    assert _value(plan, kf.MEMORY_HIGH) == str(expected)
    assert any(n.startswith("memory.high = 70% of MemTotal") for n in plan.notes)


@pytest.mark.parametrize(
    ("size", "page", "expected"),
    [
        ("1.1GiB", 4096, 1181114368),  # 1181116006.4 -> floor to 4 KiB
        ("1000", 4096, 0),
        ("4097", 4096, 4096),
        ("1.1GiB", 65536, 1181089792),  # a 64 KiB-page arm64 kernel
        ("1.1GiB", 16384, 1181106176),
    ],
)
def test_memory_values_are_floored_to_the_page_size(size: str, page: int, expected: int) -> None:
    host = replace(_host("rk3588"), page_size=page)
    plan = _compile(f"name = 'pg'\n[memory]\nmax = '{size}'\n", host)
    assert int(_value(plan, kf.MEMORY_MAX)) == expected
    assert expected % page == 0


def test_memory_max_string_is_written_as_max() -> None:
    plan = _compile("name = 'mx'\n[memory]\nhigh = '1GiB'\nmax = 'max'\nswap_max = 'max'\n")
    assert _value(plan, kf.MEMORY_MAX) == "max"
    assert _value(plan, kf.MEMORY_SWAP_MAX) == "max"


def test_memory_order_is_checked_again_after_resolving_percentages() -> None:
    with pytest.raises(PolicyError) as info:
        _compile("name = 'o'\n[memory]\nmin = '60%'\nhigh = '1GiB'\n")  # 60% of 1.92 GiB
    err = info.value
    assert err.exit_code == 65
    assert err.field == "memory"
    assert err.file == "test.toml"
    assert "memory.min (1.15GiB) is above memory.high (1GiB) on this host" in str(err)


def test_memory_min_model_without_a_workload_is_a_policy_error() -> None:
    with pytest.raises(PolicyError) as info:
        _compile("name = 'mm'\n[memory]\nmin = 'model'\n")
    assert info.value.exit_code == 65
    assert info.value.field == "memory.min"
    assert info.value.hint is not None


def test_memory_min_model_with_a_workload_is_model_plus_margin() -> None:
    model = 1_100_000_000
    plan = _compile("name = 'mm'\n[memory]\nmin = 'model'\n", workload=Workload(model_bytes=model))
    assert MEMORY_MIN_MODEL_MARGIN == 64 * MIB
    assert _value(plan, kf.MEMORY_MIN) == str((model + MEMORY_MIN_MODEL_MARGIN) // 4096 * 4096)
    assert any(n.startswith("memory.min = model -> ") for n in plan.notes)


_BOARD_FILE = "name = 'bf'\n[[pressure]]\nwhen = 'board file < model'\ndo = ['log']\n"


def test_board_file_below_model_is_the_model_files_size() -> None:
    # issue 47: the shed's floor is the engine's model, the size of the files its argv names
    plan = _compile(_BOARD_FILE, workload=Workload(model_bytes=1_100_000_000))
    (w,) = plan.watch
    assert w.when == "board file < model"
    assert not isinstance(w.trigger, WatchTrigger)
    assert (w.trigger.condition, w.trigger.threshold) == ("board_file", 1_100_000_000)
    assert w.trigger.text() == "board file < 1100000000"
    sized = _compile(_BOARD_FILE.replace("model'", "800M'"))
    assert sized.watch[0].trigger.threshold == 800 * MIB  # type: ignore[union-attr]  # a condition


def test_a_reclaims_swappiness_is_in_the_plan_and_absent_without_one() -> None:
    text = "name = 'rs'\n[[pressure]]\nwhen = 'memory some 150ms/2s'\ndo = ['reclaim 64M swappiness=0', 'reclaim 8M']\n"
    plan = _compile(text)
    balanced, plain = plan.watch[0].actions
    assert (balanced.bytes, balanced.swappiness, str(balanced)) == (
        64 * MIB, 0, "reclaim 64MiB swappiness=0",
    )  # fmt: skip
    assert plain.swappiness is None
    assert Plan.from_json(plan.to_json()) == plan
    shown = [a for a in plan.to_dict()["watch"][0]["actions"]]
    assert shown[0]["swappiness"] == 0 and "swappiness" not in shown[1]  # goldens keep their shape


def test_board_file_below_model_without_a_workload_names_the_rule() -> None:
    with pytest.raises(PolicyError) as info:
        _compile(_BOARD_FILE)
    assert info.value.exit_code == 65
    assert info.value.field == "pressure[0].when"
    assert "needs the model file" in info.value.reason
    assert info.value.file == "test.toml" and info.value.hint is not None


def test_memory_min_model_above_memory_max_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match=r"memory\.min .* is above memory\.max"):
        _compile(
            "name = 'mm'\n[memory]\nmin = 'model'\nmax = '1GiB'\n",
            workload=Workload(model_bytes=GIB),
        )


def test_memory_low_model_without_a_workload_names_memory_low() -> None:
    with pytest.raises(PolicyError) as info:
        _compile("name = 'ml'\n[memory]\nlow = 'model'\n")
    assert info.value.field == "memory.low"
    assert "memory.min" not in info.value.reason


def test_memory_model_error_names_the_policy_file() -> None:
    with pytest.raises(PolicyError) as info:
        _compile("name = 'mm'\n[memory]\nmin = 'model'\n")
    assert info.value.file == "test.toml"


@pytest.mark.parametrize(
    ("memlock", "workload", "expected"),
    [
        ("'model'", None, "model"),
        ("'model'", Workload(model_bytes=1000), 1000 + MEMLOCK_MODEL_MARGIN),
        ("'unlimited'", None, -1),
        ("'2GiB'", None, 2 * GIB),
        ("65536", None, 65536),
    ],
)
def test_memlock_is_resolved_for_the_launcher(
    memlock: str, workload: Workload | None, expected: int | str
) -> None:
    plan = _compile(f"name = 'ml'\n[process]\nmemlock = {memlock}\n", workload=workload)
    assert plan.launch.memlock == expected


# ---------------------------------------------------------------- CPUs


def test_big_on_a_host_without_core_types_is_a_clear_host_error() -> None:
    err = _host_error("name = 'b'\n[cpu]\ncpus = 'big'\n", "cgroup2-full")
    assert err.exit_code == 69
    assert 'cpu.cpus = "big" but this host has no distinct core types' in str(err)


def test_little_on_a_host_without_core_types_is_a_clear_host_error() -> None:
    err = _host_error("name = 'l'\n[cpu]\ncpus = 'little'\n", "cgroup2-full")
    assert 'cpu.cpus = "little"' in str(err)


def test_little_resolves_from_cpufreq_clusters_too() -> None:
    host = _host("rk3588")
    assert host.core_types is not None
    cpufreq = replace(host, core_types=replace(host.core_types, source="cpufreq"))
    plan = _compile("name = 'l'\n[cpu]\ncpus = 'little'\n", cpufreq)
    assert _value(plan, kf.CPUSET_CPUS) == "0-3"
    assert "cpu.cpus = little -> 0-3 (from cpufreq)" in plan.notes


def test_cpu_list_naming_offline_cpus_is_exit_69_listing_them() -> None:
    host = replace(_host("rk3588"), cpus_online=(0, 1, 2, 3, 4, 5))
    err = _host_error("name = 'c'\n[cpu]\ncpus = '2,4-7,9'\n", host)
    assert err.exit_code == 69
    assert "cpu.cpus names CPU 6-7,9 which is not online (online: 0-5)" in str(err)


def test_explicit_cpu_list_is_written_in_kernel_spelling() -> None:
    plan = _compile("name = 'c'\n[cpu]\ncpus = '6,0-3'\n")
    assert _value(plan, kf.CPUSET_CPUS) == "0-3,6"
    assert plan.launch.affinity == (0, 1, 2, 3, 6)


def test_cpus_all_sets_affinity_but_writes_no_cpuset() -> None:
    plan = _compile("name = 'a'\n[cpu]\ncpus = 'all'\n")
    assert plan.writes == ()
    assert "cpuset" not in plan.controllers
    assert plan.launch.affinity == tuple(range(8))


# ---------------------------------------------------------------- host problems


def test_hybrid_host_lists_every_missing_controller_and_the_cpu_problem_at_once() -> None:
    policy = load(POLICY_DIR / "npu-chat.toml")
    host = _host("hybrid-host", policy)
    with pytest.raises(HostError) as info:
        compile_plan(policy, host)
    err = info.value
    assert err.exit_code == 69
    message = str(err)
    assert "\n" not in message
    for ctrl in ("pids", "memory", "cpu", "cpuset"):
        assert f"controller {ctrl} is not available" in message
    assert "held by cgroup v1" in message
    assert 'cpu.cpus = "big"' in message
    assert set(err.missing) == {"pids", "memory", "cpu", "cpuset"}
    assert err.hint is not None
    assert "systemd.unified_cgroup_hierarchy=1" in err.hint
    assert "--allow-missing cpu,cpuset,memory,pids" in err.hint


def test_allow_missing_turns_missing_controllers_into_degraded_entries() -> None:
    policy = load(POLICY_DIR / "base.toml")
    host = _host("hybrid-host", policy)
    plan = compile_plan(policy, host, allow_missing=frozenset({"memory", "pids"}))
    assert plan.writes == ()
    assert plan.controllers == ()
    assert plan.enable == ()
    assert len(plan.degraded) == 3
    for entry, write, ctrl in zip(
        plan.degraded,
        ["pids.max = 512", "memory.oom.group = 1", "memory.swap.max = 0"],
        ["pids", "memory", "memory"],
        strict=True,
    ):
        assert entry.startswith(write)
        assert f"({ctrl} controller missing)" in entry


def test_allow_missing_one_controller_still_reports_the_others() -> None:
    policy = load(POLICY_DIR / "base.toml")
    host = _host("hybrid-host", policy)
    with pytest.raises(HostError) as info:
        compile_plan(policy, host, allow_missing=frozenset({"memory"}))
    assert "controller pids is not available" in str(info.value)
    assert "controller memory" not in str(info.value)


def test_allow_missing_does_not_excuse_a_cpu_list_problem() -> None:
    text = "name = 'b'\n[cpu]\ncpus = 'big'\n"
    err = _host_error(text, "hybrid-host", allow=frozenset({"cpuset"}))
    assert 'cpu.cpus = "big"' in str(err)


def test_controller_missing_in_an_existing_ancestor_is_reported_with_its_path() -> None:
    # attached to a service under system.slice: the plan enables nothing in system.slice
    host = replace(
        _host("cgroup2-full"),
        path=(
            CgroupLevel(
                path="system.slice", controllers=frozenset({"memory", "cpu"}),
                subtree_control=frozenset({"memory"}),
            ),
            CgroupLevel(
                path="system.slice/cam.service", controllers=frozenset({"memory"}),
                subtree_control=frozenset(),
            ),
        ),
    )  # fmt: skip
    policy = load_text("name = 'w'\n[cpu]\nweight = 200\n")
    with pytest.raises(HostError) as info:
        compile_plan(policy, host, attach="system.slice/cam.service")
    assert "controller cpu is not available" in str(info.value)
    assert "system.slice/cam.service/cgroup.controllers" in str(info.value)


def test_a_fresh_slice_without_the_controller_yet_compiles_and_the_plan_enables_it() -> None:
    # another launch just made governor.slice and has not yet enabled cpu in the root: the
    # root offers cpu and this plan enables it in the root's and the slice's subtree_control
    host = replace(
        _host("cgroup2-full"),
        path=(
            CgroupLevel(
                path="governor.slice", controllers=frozenset(), subtree_control=frozenset()
            ),
            CgroupLevel(
                path="governor.slice/w", controllers=frozenset(), subtree_control=frozenset()
            ),
        ),
    )
    plan = compile_plan(load_text("name = 'w'\n[cpu]\nweight = 200\n"), host)
    assert [(e.cgroup, "cpu" in e.controllers) for e in plan.enable] == [
        ("", True), ("governor.slice", True),
    ]  # fmt: skip


def test_no_cgroup2_mount_is_exit_69() -> None:
    err = _host_error("name = 'x'\n", "old-big-little")
    assert err.exit_code == 69
    assert "no cgroup2 hierarchy is mounted" in str(err)


PRESSURE_ONLY = (
    "name = 'p'\n[cpu]\nweight = 100\n[[pressure]]\nwhen = 'cpu some 100ms/1s'\ndo = ['log']\n"
)


def test_pressure_rules_without_psi_are_exit_69() -> None:
    err = _host_error(PRESSURE_ONLY, "no-psi")
    assert err.exit_code == 69
    assert "PSI is not available" in str(err)
    assert "[[pressure]] rules need it" in str(err)
    assert err.hint is not None
    assert "psi=1" in err.hint


def test_pressure_rules_without_psi_degrade_with_allow_missing_psi() -> None:
    plan = _compile(PRESSURE_ONLY, "no-psi", allow=frozenset({"psi"}))
    (entry,) = plan.degraded
    assert entry.startswith("[[pressure]] rules")
    assert "PSI missing" in entry
    assert _value(plan, kf.CPU_WEIGHT) == "100"


def test_no_psi_host_lists_the_missing_memory_controller_and_psi_together() -> None:
    policy = load(POLICY_DIR / "base.toml")
    with pytest.raises(HostError) as info:
        compile_plan(policy, _host("no-psi", policy))
    message = str(info.value)
    assert "controller memory is not available" in message
    assert "PSI is not available" in message


# ---------------------------------------------------------------- purity


class _NoEnviron(Mapping[str, str]):
    def __getitem__(self, key: str) -> NoReturn:
        raise AssertionError(f"compiler read os.environ[{key!r}]")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("compiler iterated os.environ")

    def __len__(self) -> int:
        raise AssertionError("compiler measured os.environ")


def _forbidden(name: str) -> Any:
    def fail(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError(f"compiler called {name}")

    return fail


def test_compiler_does_no_io_env_or_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    policies = [load(POLICY_DIR / f"{name}.toml") for name in ("base", "npu-chat", "npu-batch")]
    host = _host("rk3588")
    workload = Workload(model_bytes=1_100_000_000)
    forbidden: list[tuple[Any, str]] = [
        (builtins, "open"),
        (os, "open"),
        (os, "stat"),
        (os, "lstat"),
        (os, "listdir"),
        (os, "scandir"),
        (os, "getenv"),
        (time, "time"),
        (time, "time_ns"),
        (time, "monotonic"),
        (time, "monotonic_ns"),
        (pathlib.Path, "read_text"),
        (pathlib.Path, "read_bytes"),
        (pathlib.Path, "open"),
        (pathlib.Path, "stat"),
        (pathlib.Path, "exists"),
    ]
    # undone before pytest itself needs files again (reporting stats and reads sources)
    with monkeypatch.context() as m:
        for target, name in forbidden:
            m.setattr(target, name, _forbidden(f"{target.__name__}.{name}"))
        m.setattr(os, "environ", _NoEnviron())
        plans = [compile_plan(p, host, workload=workload) for p in policies]
        again = [compile_plan(p, host, workload=workload) for p in policies]
    assert plans == again  # and deterministic
    assert [p.policy for p in plans] == ["base", "npu-chat", "npu-batch"]


# ---------------------------------------------------------------- random valid policies

FULL_HOST = probe(HOSTS / "cgroup2-full")  # 4 alike CPUs, every controller, PSI
_BYTES = st.integers(min_value=1 * MIB, max_value=6 * GIB)


@st.composite
def _memory(draw: st.DrawFn) -> dict[str, object]:
    keys = draw(st.lists(st.sampled_from(["min", "low", "high", "max"]), unique=True))
    order = [k for k in ("min", "low", "high", "max") if k in keys]
    values = sorted(draw(st.lists(_BYTES, min_size=len(order), max_size=len(order))))
    out: dict[str, object] = {}
    for key, n in zip(order, values, strict=True):
        out[key] = draw(st.sampled_from([n, v.format_bytes(n)]))
    if "max" in out and draw(st.booleans()):
        out["max"] = "max"
    if draw(st.booleans()):
        out["swap_max"] = draw(st.one_of(_BYTES, st.just("max"), st.just("25%")))
    if draw(st.booleans()):
        out["oom_group"] = draw(st.booleans())
    return out


@st.composite
def _pressure(draw: st.DrawFn) -> dict[str, object]:
    resource = draw(st.sampled_from(["memory", "io", "cpu"]))
    kind = "some" if resource == "cpu" else draw(st.sampled_from(["some", "full"]))
    window = draw(st.integers(min_value=500, max_value=10_000))
    stall = draw(st.integers(min_value=1, max_value=window))
    rule: dict[str, object] = {
        "when": f"{resource} {kind} {stall}ms/{window}ms",
        "do": draw(
            st.lists(
                st.sampled_from(
                    [
                        "log",
                        "signal SIGUSR1",
                        "reclaim 64M",
                        "set memory.high -10%",
                        "set cpu.weight 20",
                        "freeze 5s",
                        "thaw",
                        "kill",
                        "restart",
                        "exec logger stall",
                    ]
                ),
                min_size=1,
                max_size=4,
            )
        ),
    }
    if draw(st.booleans()):
        rule["for"] = f"{draw(st.integers(min_value=1, max_value=60))}s"
    if draw(st.booleans()):
        rule["cooldown"] = f"{draw(st.integers(min_value=1, max_value=600))}s"
    return rule


@st.composite
def _policies(draw: st.DrawFn) -> dict[str, object]:
    raw: dict[str, object] = {
        "name": draw(st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True)),
        "slice": draw(st.sampled_from(["governor.slice", "llm.slice", "a-b_c.slice"])),
        "memory": draw(_memory()),
    }
    cpu: dict[str, object] = {}
    if draw(st.booleans()):
        cpu["weight"] = draw(st.integers(min_value=1, max_value=10000))
    if draw(st.booleans()):
        subset = draw(st.sets(st.integers(min_value=0, max_value=3), min_size=1))
        cpu["cpus"] = draw(st.sampled_from(["all", ",".join(map(str, sorted(subset)))]))
    if draw(st.booleans()):
        cpu["max"] = draw(st.sampled_from(["max", f"{draw(st.integers(1, 400))}%"]))
    raw["cpu"] = cpu
    if draw(st.booleans()):
        raw["io"] = {"weight": draw(st.integers(min_value=1, max_value=10000))}
    if draw(st.booleans()):
        raw["pids"] = {"max": draw(st.one_of(st.integers(1, 100_000), st.just("max")))}
    if draw(st.booleans()):
        raw["process"] = {
            "oom_score_adj": draw(st.integers(-1000, 1000)),
            "nice": draw(st.integers(-20, 19)),
        }
    raw["pressure"] = draw(st.lists(_pressure(), max_size=3))
    return raw


@settings(max_examples=150, deadline=None)
@given(_policies())
def test_random_valid_policies_compile_on_the_full_cgroup2_host(raw: dict[str, object]) -> None:
    policy = Policy.model_validate(raw)
    plan = compile_plan(policy, FULL_HOST)
    assert plan.policy == policy.name
    assert plan.group == f"{policy.slice}/{policy.name}"
    order = [kf.CONTROLLER_ORDER.index(w.controller or "") for w in plan.writes]
    assert order == sorted(order)
    for w in plan.writes:
        if w.file.startswith("memory.") and w.value.isdigit() and w.file != "memory.oom.group":
            assert int(w.value) % FULL_HOST.page_size == 0
    assert len(plan.watch) == len(policy.pressure)
    assert Plan.from_json(plan.to_json()) == plan


def test_an_attached_plan_targets_the_given_cgroup_so_its_limits_bound_the_actions() -> None:
    """`governor monitor --cgroup U`: the plan is compiled for U (group, leaf and every write),
    not patched afterwards, so the executor reads the policy's memory.max for U."""
    text = "name = 'att'\n[memory]\nhigh = '1G'\nmax = '1.5G'\n"
    unit = "system.slice/llama.service"
    plan = compile_plan(_policy(text), _host("rk3588"), attach=unit, source="test.toml")
    assert (plan.group, plan.leaf, plan.create) == (unit, unit, ())
    assert {w.cgroup for w in plan.writes} == {unit}
    assert plan.limit("memory.max") == int(1.5 * (1 << 30)) // 4096 * 4096
