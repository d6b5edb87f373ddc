"""The systemd renderer (governor/deploy/dropin.py) and the pure parts of the systemd backend
(governor/backends/systemd.py): systemd-escape semantics and slice nesting, golden unit files
for policies/*.toml on the rk3588 and cgroup2-full fixture hosts, version gates, the D-Bus
signature table, the delegated plan, and `systemd-analyze verify` on every rendered unit.

Needs: the host fixture trees and the example policies; `systemd-escape` and `systemd-analyze`
(Debian 12's systemd package; they work without systemd as PID 1).
Regenerate the goldens with GOVERNOR_UPDATE_GOLDEN=1 after an intended change, and review them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.golden import update_requested

from governor.backends import choose, placement
from governor.backends import systemd as sd
from governor.compile import placements as compiled_placement
from governor.compile.compiler import compile_plan
from governor.deploy import dropin
from governor.errors import HostError
from governor.kernel import files as kf
from governor.plan import unitmap
from governor.plan.host import probe
from governor.plan.model import Plan
from governor.policy.loader import load, load_text

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
POLICY_DIR = REPO / "policies"
GOLDEN = REPO / "tests" / "golden" / "units"
UNITS = REPO / "units"
GOLDEN_GOVERNOR = "/usr/bin/governor"
HOST_NAMES = ("rk3588", "cgroup2-full")
EXAMPLE_POLICIES = sorted(p.stem for p in POLICY_DIR.glob("*.toml"))


def _plan(policy: str, host: str) -> Plan:
    loaded = load(POLICY_DIR / f"{policy}.toml")
    return compile_plan(loaded, probe(HOSTS / host), source=f"policies/{policy}.toml")


def _text_plan(text: str, host: str = "rk3588") -> Plan:
    return compile_plan(load_text(text, source="test.toml"), probe(HOSTS / host))


# the pairs that compile, read from the reviewed plan goldens (.json compiles, .err is
# refused), not by compiling at collection time: a pair that stops compiling FAILS its case
PLAN_GOLDEN = REPO / "tests" / "golden" / "plans"
CASES = [
    (p, h)
    for p in EXAMPLE_POLICIES
    for h in HOST_NAMES
    if not (PLAN_GOLDEN / f"{p}@{h}.err").exists()
]


# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("npu-chat", "npu\\x2dchat"),
        ("npu_chat", "npu_chat"),
        ("a-b-c", "a\\x2db\\x2dc"),
        ("x.y", "x.y"),
        (".hidden", "\\x2ehidden"),
        ("a/b", "a-b"),
        ("sp ace", "sp\\x20ace"),
        ("ü", "\\xc3\\xbc"),
    ],
)
def test_escape_follows_systemd_escape(text: str, escaped: str) -> None:
    assert unitmap.escape(text) == escaped
    tool = shutil.which("systemd-escape")
    if tool is not None:
        out = subprocess.run([tool, "--", text], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == escaped


@pytest.mark.parametrize(
    ("unit", "path"),
    [
        ("governor.slice", "governor.slice"),
        ("a-b.slice", "a.slice/a-b.slice"),
        ("a-b-c.slice", "a.slice/a-b.slice/a-b-c.slice"),
        ("governor-npu\\x2dchat.slice", "governor.slice/governor-npu\\x2dchat.slice"),
        ("-.slice", ""),
    ],
)
def test_a_dash_in_a_slice_name_means_nesting(unit: str, path: str) -> None:
    assert unitmap.slice_cgroup(unit) == path


def test_policy_names_with_dashes_get_their_own_slice_not_a_nested_one() -> None:
    ps = unitmap.policy_slice("governor.slice", "npu-chat")
    assert ps == "governor-npu\\x2dchat.slice"
    # without escaping, governor-npu-chat.slice would live in governor-npu.slice
    assert unitmap.slice_cgroup(ps) == "governor.slice/governor-npu\\x2dchat.slice"
    assert unitmap.policy_slice("system-llm.slice", "a-b") == "system-llm-a\\x2db.slice"
    assert unitmap.slice_cgroup(unitmap.policy_slice("system-llm.slice", "a-b")) == (
        "system.slice/system-llm.slice/system-llm-a\\x2db.slice"
    )


def test_unit_cgroups_for_the_service_and_the_scope() -> None:
    plan = _text_plan('name = "npu-chat"\n[memory]\nmax = "1GiB"\n')
    assert unitmap.service_cgroup(plan) == (
        "governor.slice/governor-npu\\x2dchat.slice/governor@npu-chat.service"
    )
    assert unitmap.scope_cgroup(plan) == "governor.slice/governor-npu\\x2dchat.scope"


# ---------------------------------------------------------------- goldens


def _render(plan: Plan, version: int = 252) -> list[dropin.UnitFile]:
    return dropin.render_install(
        plan,
        version,
        policy_path=f"/etc/governor/{plan.policy}.toml",
        governor=GOLDEN_GOVERNOR,
    )


@pytest.mark.parametrize(("policy", "host"), CASES, ids=[f"{p}@{h}" for p, h in CASES])
def test_rendered_units_match_their_goldens(policy: str, host: str) -> None:
    plan = _plan(policy, host)
    assert plan is not None
    version = probe(HOSTS / host).systemd_version
    assert version == 252
    root = GOLDEN / f"{policy}@{host}"
    rendered = {uf.path: uf.text for uf in _render(plan, version)}
    if update_requested():
        shutil.rmtree(root, ignore_errors=True)
        for rel, text in rendered.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    on_disk = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert on_disk == rendered, f"{root} is stale; rerun with GOVERNOR_UPDATE_GOLDEN=1"


def test_the_npu_chat_board_rendering_is_in_the_golden_set() -> None:
    assert ("npu-chat", "rk3588") in CASES
    assert ("npu-batch", "rk3588") in CASES


def test_units_dir_holds_the_shipped_templates_and_an_example() -> None:
    assert (UNITS / "governor.slice").read_text() == dropin.GOVERNOR_SLICE
    assert (UNITS / "governor@.service").read_text() == dropin.render_service_template()
    example = GOLDEN / "npu-chat@rk3588" / dropin.UNIT_DIR
    for p in example.rglob("*"):
        if p.is_file() and p.name not in ("governor.slice", "governor@.service"):
            rel = p.relative_to(example)
            assert (UNITS / "examples" / rel).read_text() == p.read_text(), rel


def test_npu_chat_slice_carries_every_limit_and_names_what_governor_applies() -> None:
    plan = _plan("npu-chat", "rk3588")
    assert plan is not None
    text = dropin.render_slice(plan, 252)
    for line in (
        "TasksMax=512",
        "MemorySwapMax=0",
        "MemoryMin=1181114368",
        "MemoryHigh=1717985280",
        "MemoryMax=1932734464",
        "CPUWeight=200",
        "CPUQuota=350%",
        "AllowedCPUs=4-7",
    ):
        assert f"\n{line}\n" in text
    # never silently dropped: oom.group, memlock=model, prefetch and the rules are named
    assert "memory.oom.group = 1 on the engine leaf" in text
    assert 'process.memlock = "model"' in text
    assert "[[pressure]]" in text
    assert "prefetch.mode = populate" in text


def test_service_drop_in_sets_slice_policy_and_process_settings() -> None:
    plan = _plan("npu-batch", "rk3588")
    assert plan is not None
    text = dropin.render_instance(
        plan, 252, policy_path="/etc/governor/npu-batch.toml", engine=["/opt/llama", "-m", "a b"]
    )
    assert "\nSlice=governor-npu\\x2dbatch.slice\n" in text
    assert "\nEnvironment=GOVERNOR_POLICY=/etc/governor/npu-batch.toml\n" in text
    assert "\nOOMScoreAdjust=800\n" in text
    assert "\nNice=10\n" in text
    assert "\nOOMPolicy=continue\n" in text
    assert "\nExecStart=\n" in text
    assert (
        "\nExecStart=/usr/local/bin/governor launch --backend systemd --policy"
        ' /etc/governor/npu-batch.toml -- /opt/llama -m "a b"\n'
    ) in text


def test_exec_words_escape_specifiers_variables_and_quotes() -> None:
    assert dropin.quote_exec_word("50%") == "50%%"
    assert dropin.quote_exec_word("$HOME") == '"$$HOME"'
    assert dropin.quote_exec_word('say "hi"') == '"say \\"hi\\""'
    assert dropin.quote_word("A=b c") == '"A=b c"'


# ---------------------------------------------------------------- version gates


def test_old_systemd_leaves_allowed_cpus_and_memory_min_to_the_governor() -> None:
    plan = _plan("npu-chat", "rk3588")
    assert plan is not None
    parts = unitmap.split(plan, 239)
    deferred = {d.write.file: d.why for d in parts.governor}
    assert "AllowedCPUs= needs systemd >= 244 (this host: 239)" in deferred[kf.CPUSET_CPUS]
    assert "MemoryMin= needs systemd >= 240" in deferred[kf.MEMORY_MIN]
    assert kf.MEMORY_OOM_GROUP in deferred
    text = dropin.render_slice(plan, 239)
    assert "AllowedCPUs=" not in text.replace("# ", "").split("[Slice]")[1].split("Not set")[0]
    assert "cpuset.cpus = 4-7 on the engine leaf" in text
    assert (
        "OOMPolicy"
        not in dropin.render_instance(plan, 242, policy_path="/p.toml")
        .split("# OOMPolicy")[0]
        .split("[Service]")[1]
    )


def test_a_cpu_quota_percent_needs_two_decimals_or_the_governor_writes_it() -> None:
    plan = _text_plan('name = "q"\n[cpu]\nmax = "33.333%"\n')
    (w,) = [w for w in plan.writes if w.file == kf.CPU_MAX]
    assert w.value == "33333 100000"
    parts = unitmap.split(plan, 252)
    assert [d.write.file for d in parts.governor] == [kf.CPU_MAX]
    ok = unitmap.split(_text_plan('name = "q"\n[cpu]\nmax = "12.5%"\n'), 252)
    assert [s.ini for s in ok.unit] == ["12.5%"]
    assert ok.unit[0].bus() == [("CPUQuotaPerSecUSec", 125000)]


# ---------------------------------------------------------------- D-Bus signatures


def test_cpu_mask_is_a_little_endian_bitmask() -> None:
    assert unitmap.cpu_mask([4, 5, 6, 7]) == b"\xf0"
    assert unitmap.cpu_mask([0, 9]) == b"\x01\x02"
    assert unitmap.cpu_mask([]) == b""


_SAMPLE = {
    kf.PIDS_MAX: "max",
    kf.MEMORY_OOM_GROUP: "1",
    kf.MEMORY_SWAP_MAX: "0",
    kf.MEMORY_MIN: "4096",
    kf.MEMORY_LOW: "4096",
    kf.MEMORY_HIGH: "max",
    kf.MEMORY_MAX: "8192",
    kf.IO_WEIGHT: "default 50",
    kf.CPU_WEIGHT: "100",
    kf.CPU_MAX: "50000 50000",
    kf.CPUSET_CPUS: "0-3",
    kf.CPUSET_MEMS: "0",
}


def test_every_property_the_renderer_can_emit_has_a_dbus_signature() -> None:
    names: set[str] = set()
    for m in unitmap.LIMITS:
        if m.directive is None:
            continue
        assert m.bus is not None, m
        names |= {name for name, _ in m.bus(_SAMPLE[m.cgroup_file])}
    names |= {directive for _, directive in dropin.SERVICE_DIRECTIVES}
    missing = names - set(sd.DBUS_SIGNATURES)
    assert not missing
    # and every [Service]/[Slice] directive line the renderer writes is covered
    for policy, host in CASES:
        plan = _plan(policy, host)
        assert plan is not None
        for uf in _render(plan):
            for line in uf.text.splitlines():
                key = line.split("=", 1)[0]
                if "=" not in line or line.startswith("#") or uf.path.endswith("governor@.service"):
                    continue
                if key in ("Description", "Before", "ExecStart", "TimeoutStartSec"):
                    continue  # unit-file only; the scope's Description is in the table
                dbus = {"CPUQuota": "CPUQuotaPerSecUSec"}.get(key, key)
                assert dbus in sd.DBUS_SIGNATURES, (uf.path, key)


def test_pystemd_lacks_signatures_we_supply() -> None:
    sigs = pytest.importorskip("pystemd.systemd1.unit_signatures").KNOWN_UNIT_SIGNATURES
    ours = {"AllowedCPUs": "ay", "CPUWeight": "t", "MemoryMin": "t", "OOMPolicy": "s", "PIDs": "au"}
    for name, sig in ours.items():
        assert sd.DBUS_SIGNATURES[name] == sig
        assert name.encode() not in sigs, f"pystemd now knows {name}; the table stays ours"


def test_scope_properties_carry_limits_delegation_and_the_pid() -> None:
    plan = _plan("npu-chat", "rk3588")
    assert plan is not None
    props = {name: (sig, value) for name, sig, value in sd.scope_properties(plan, 252, 4242)}
    assert props["PIDs"] == ("au", [4242])
    assert props["Delegate"] == ("b", True)
    assert props["Slice"] == ("s", "governor.slice")
    assert props["AllowedCPUs"] == ("ay", b"\xf0")
    assert props["MemoryMax"] == ("t", 1932734464)
    assert props["CPUQuotaPerSecUSec"] == ("t", 3_500_000)
    assert props["TasksMax"] == ("t", 512)
    assert "OOMPolicy" not in props  # scopes take it from systemd 253 on
    props253 = {name for name, _, _ in sd.scope_properties(plan, 253, 1)}
    assert "OOMPolicy" in props253


def test_infinity_is_uint64_max_on_the_bus() -> None:
    plan = _text_plan('name = "x"\n[memory]\nhigh = "max"\n[pids]\nmax = "max"\n')
    props = {n: v for n, _, v in sd.scope_properties(plan, 252, 1)}
    assert props["MemoryHigh"] == (1 << 64) - 1
    assert props["TasksMax"] == (1 << 64) - 1


# ---------------------------------------------------------------- the delegated plan


def test_delegated_plan_keeps_only_what_systemd_cannot_express_on_the_engine_leaf() -> None:
    plan = _plan("npu-chat", "rk3588")
    assert plan is not None
    unit = unitmap.service_cgroup(plan)
    d = compiled_placement.delegated_plan(plan, unit, 252)
    assert d.group == d.leaf == f"{unit}/engine"
    assert d.create == (f"{unit}/engine",)
    assert [(w.cgroup, w.file, w.value) for w in d.writes] == [
        (f"{unit}/engine", kf.MEMORY_OOM_GROUP, "1")
    ]
    assert [(e.cgroup, e.controllers) for e in d.enable] == [(unit, plan.controllers)]
    assert d.launch == plan.launch
    old = compiled_placement.delegated_plan(plan, unit, 240)
    assert {w.file for w in old.writes} == {kf.MEMORY_OOM_GROUP, kf.CPUSET_CPUS}


def test_proc_cgroup_line_and_mode_detection() -> None:
    plan = _text_plan('name = "npu-chat"\n')
    unit = unitmap.service_cgroup(plan)
    assert placement.parse_proc_cgroup(f"0::/{unit}\n") == unit
    hybrid = "12:memory:/x\n1:name=systemd:/y\n0::/user.slice/s.scope\n"
    assert placement.parse_proc_cgroup(hybrid) == "user.slice/s.scope"
    placements = compiled_placement.compile_placements(plan, 252)
    assert placement.pick(placements, unit).mode == "service"
    assert placement.pick(placements, unit).plan == compiled_placement.delegated_plan(
        plan, unit, 252
    )
    scope = placement.pick(placements, "system.slice/ssh.service")
    assert (scope.mode, scope.cgroup) == ("scope", unitmap.scope_cgroup(plan))
    with pytest.raises(HostError, match="not in its policy slice"):
        placement.pick(placements, "governor.slice/governor@npu-chat.service")


def test_auto_picks_systemd_only_when_pid1_is_systemd_and_the_bus_answers() -> None:
    assert choose.choose("auto", pid1="systemd", answers=lambda: True) == "systemd"
    assert choose.choose("auto", pid1="systemd", answers=lambda: False) == "cgroupfs"
    assert choose.choose("auto", pid1="init", answers=lambda: True) == "cgroupfs"
    assert choose.choose("systemd", pid1="init") == "systemd"


def test_without_pystemd_the_scope_fails_with_the_extra_and_apt_packages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pystemd", None)
    with pytest.raises(HostError) as info:
        sd.PystemdBus()
    assert info.value.exit_code == 69
    assert info.value.hint is not None
    assert "pip install 'cgroup-governor[systemd]'" in info.value.hint
    assert "libsystemd-dev pkg-config gcc" in info.value.hint


# ---------------------------------------------------------------- systemd-analyze verify


@pytest.mark.parametrize(("policy", "host"), CASES, ids=[f"{p}@{h}" for p, h in CASES])
def test_systemd_analyze_verify_accepts_every_rendered_unit(
    policy: str, host: str, tmp_path: Path
) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    plan = _plan(policy, host)
    assert plan is not None
    governor = str(Path(sys.executable).with_name("governor"))  # ExecStart= must exist
    policy_file = POLICY_DIR / f"{policy}.toml"
    files = dropin.render_install(
        plan, 252, policy_path=str(policy_file), governor=governor, engine=["/bin/sleep", "1"]
    )
    for uf in files:
        (tmp_path / uf.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / uf.path).write_text(uf.text)
    unit_dir = tmp_path / dropin.UNIT_DIR
    env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{unit_dir}:", SYSTEMD_LOG_LEVEL="notice")
    units = [*dropin.unit_names(plan), "governor.slice"]
    out = subprocess.run(
        [tool, "verify", "--man=no", *units],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    ours = [
        line
        for line in (out.stdout + out.stderr).splitlines()
        if str(unit_dir) in line or "governor" in line
    ]
    assert out.returncode == 0, out.stdout + out.stderr
    assert not ours, "\n".join(ours)
