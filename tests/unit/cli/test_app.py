"""The command line (governor/cli/app.py): check / plan / plan --json / schema / doctor against fixture
roots via the global --root, exit codes, and the one-line ``governor: <message>`` + ``hint:``
error format on stderr with no traceback (unless --debug). One subprocess run of
``python -m governor --help``.

Needs: the host fixture trees, the example policies and tests/fixtures/policies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from governor.cli.app import app
from governor.plan.model import Plan

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
POLICY_DIR = REPO / "policies"
FIXTURE_POLICIES = REPO / "tests" / "fixtures" / "policies"
RK3588 = str(HOSTS / "rk3588")


def assert_one_line_error(err: str) -> str:
    """stderr is exactly `governor: <message>` and `hint: <hint>`, no traceback; the message."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[0].startswith("governor: ")
    assert len(lines) == 2, err
    assert lines[1].startswith("hint: ")
    return lines[0]


# ---------------------------------------------------------------- check


def test_check_good_policy_on_the_board_fixture_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--root", RK3588, "check", str(POLICY_DIR / "npu-chat.toml"))
    assert code == 0
    assert out.startswith(f"{POLICY_DIR / 'npu-chat.toml'}: ok (9 cgroup writes)")
    assert "Traceback" not in err


def test_check_bad_policy_exits_65_with_file_field_and_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = FIXTURE_POLICIES / "bad" / "unknown-memory-key.toml"
    code, out, err = run(capsys, "--root", RK3588, "check", str(path))
    assert code == 65
    assert out == ""
    line = assert_one_line_error(err)
    assert line == f"governor: unknown key ({path}, memory.hihg)"


def test_check_missing_policy_exits_66(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "--root", RK3588, "check", str(tmp_path / "none.toml"))
    assert code == 66
    assert "policy file not found" in assert_one_line_error(err)


def test_check_directory_as_policy_exits_66(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "--root", RK3588, "check", str(tmp_path))
    assert code == 66
    assert "directory" in assert_one_line_error(err)


def test_check_non_utf8_policy_exits_65(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b'name = "\xff\xfe"\n')
    code, _, err = run(capsys, "--root", RK3588, "check", str(path))
    assert code == 65
    assert "not valid UTF-8" in assert_one_line_error(err)


def test_check_oom_kill_disable_prints_the_v2_hint(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURE_POLICIES / "bad" / "oom-kill-disable.toml"
    code, _, err = run(capsys, "--root", RK3588, "check", str(path))
    assert code == 65
    assert_one_line_error(err)
    hint = err.splitlines()[1]
    for needle in ("memory.oom.group", "oom_score_adj = -1000", "memory.min"):
        assert needle in hint


def test_check_on_hybrid_host_exits_69_listing_every_problem(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = str(HOSTS / "hybrid-host")
    code, _, err = run(capsys, "--root", root, "check", str(POLICY_DIR / "npu-chat.toml"))
    assert code == 69
    line = assert_one_line_error(err)
    for ctrl in ("pids", "memory", "cpu", "cpuset"):
        assert f"controller {ctrl} is not available" in line
    assert 'cpu.cpus = "big"' in line
    assert "--allow-missing" in err.splitlines()[1]


def test_check_with_allow_missing_reports_limits_not_in_force(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = str(HOSTS / "hybrid-host")
    code, out, _ = run(
        capsys,
        "--root",
        root,
        "check",
        str(POLICY_DIR / "base.toml"),
        "--allow-missing",
        "memory,pids",
    )
    assert code == 0
    assert "0 cgroup writes, 3 limit(s) NOT in force" in out
    assert "pids.max = 512" in out


def test_check_with_unknown_allow_missing_name_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(
        capsys, "--root", RK3588, "check", str(POLICY_DIR / "base.toml"), "--allow-missing", "gpu"
    )
    assert code == 2
    assert "unknown name in --allow-missing: gpu" in assert_one_line_error(err)


def test_check_cpu_list_naming_offline_cpus_exits_69(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "rk3588-offline"
    shutil.copytree(HOSTS / "rk3588", root)
    (root / "sys/devices/system/cpu/online").write_text("0-5\n")
    policy = tmp_path / "pin.toml"
    policy.write_text('name = "pin"\n[cpu]\ncpus = "4-7"\n')
    code, _, err = run(capsys, "--root", str(root), "check", str(policy))
    assert code == 69
    assert "cpu.cpus names CPU 6-7 which is not online (online: 0-5)" in assert_one_line_error(err)


def test_check_policy_without_cgroup2_exits_69(capsys: pytest.CaptureFixture[str]) -> None:
    root = str(HOSTS / "old-big-little")
    code, _, err = run(capsys, "--root", root, "check", str(POLICY_DIR / "base.toml"))
    assert code == 69
    assert "no cgroup2 hierarchy" in assert_one_line_error(err)


# ---------------------------------------------------------------- plan


def test_plan_prints_a_table_of_writes_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--root", RK3588, "plan", str(POLICY_DIR / "npu-chat.toml"))
    assert code == 0
    assert out.startswith("policy   npu-chat")
    files = [line.split()[0] for line in out.splitlines() if line.startswith("  ")][1:]
    assert files == [
        "pids.max",
        "memory.oom.group",
        "memory.swap.max",
        "memory.min",
        "memory.high",
        "memory.max",
        "cpu.weight",
        "cpu.max",
        "cpuset.cpus",
    ]
    assert "cpuset.cpus       4-7" in out
    assert "note     cpu.cpus = big -> 4-7" in out


def test_plan_json_is_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "--root", RK3588, "plan", "--json", str(POLICY_DIR / "npu-batch.toml")
    )
    assert code == 0
    plan = Plan.from_json(out)
    assert plan.policy == "npu-batch"
    assert plan.cgroup_root == f"{RK3588}/sys/fs/cgroup"
    assert [w.file for w in plan.writes][-1] == "cpuset.cpus"
    assert json.loads(out)["writes"][-1]["value"] == "0-3"


def test_plan_of_a_bad_policy_fails_like_check(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURE_POLICIES / "bad" / "trigger-window-too-short.toml"
    code, out, err = run(capsys, "--root", RK3588, "plan", "--json", str(path))
    assert code == 65
    assert out == ""
    assert "pressure[0].when" in assert_one_line_error(err)


# ---------------------------------------------------------------- schema and doctor


def test_schema_prints_the_policy_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schema")
    assert code == 0
    schema = json.loads(out)
    assert schema["title"] == "governor policy"
    assert schema["additionalProperties"] is False
    assert {"name", "memory", "cpu", "pressure"} <= set(schema["properties"])


def test_doctor_on_the_board_fixture_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--root", RK3588, "doctor")
    assert code == 0
    assert "big.LITTLE from cpu_capacity: little 0-3, big 4-7" in out
    assert "ERROR" not in out


def test_doctor_on_the_hybrid_host_exits_69_with_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--root", str(HOSTS / "hybrid-host"), "doctor")
    assert code == 69
    assert "ERROR controller.memory" in out
    assert "fix: boot with systemd.unified_cgroup_hierarchy=1" in out


def test_doctor_without_psi_says_how_to_enable_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--root", str(HOSTS / "no-psi"), "doctor")
    assert code == 69  # memory controller missing on the Pi
    assert "psi=1" in out


def test_doctor_json_lists_facts_and_findings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--root", RK3588, "doctor", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["host"]["cpus_online"] == list(range(8))
    assert {f["level"] for f in data["findings"]} <= {"ok", "warn", "error"}


# ---------------------------------------------------------------- usage, debug


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["check"],
        ["plan", "--jsn", "x.toml"],
        ["--no-such-option", "schema"],
    ],
)
def test_usage_errors_exit_2_with_a_one_line_message(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    line = assert_one_line_error(err)
    assert line.endswith("(command line)")
    assert "--help" in err.splitlines()[1]


def test_no_arguments_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2
    assert "check" in err
    assert "Traceback" not in err


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURE_POLICIES / "bad" / "high-above-max.toml"
    code, _, err = run(capsys, "--debug", "--root", RK3588, "check", str(path))
    assert code == 65
    assert err.startswith("governor: memory.high (2GiB) is above memory.max (1GiB)")
    assert "Traceback (most recent call last)" in err
    assert "PolicyError" in err
    # and the next run without --debug is quiet again
    code, _, err = run(capsys, "--root", RK3588, "check", str(path))
    assert "Traceback" not in err


def test_deeply_nested_toml_gives_exit_65_without_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("name = " + "[" * 5000 + "]" * 5000 + "\n")
    code, _, err = run(capsys, "--root", RK3588, "check", str(path))
    assert code == 65
    assert_one_line_error(err)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=200))
def test_random_bytes_as_a_policy_exit_65_without_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "random.toml"
    path.write_bytes(data)
    code, out, err = run(capsys, "--root", RK3588, "check", str(path))
    assert code == 65, err
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith("governor: ")


# ---------------------------------------------------------------- CliRunner and subprocess


def test_cli_runner_schema_and_check() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["title"] == "governor policy"
    result = runner.invoke(app, ["--root", RK3588, "check", str(POLICY_DIR / "npu-batch.toml")])
    assert result.exit_code == 0
    assert ": ok (9 cgroup writes)" in result.stdout


def test_cli_runner_help_lists_the_global_root_options() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for option in ("--root", "--cgroup-root", "--debug"):
        assert option in result.stdout


def test_python_dash_m_governor_help_runs_in_a_fresh_interpreter() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "governor", "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("check", "plan", "schema", "doctor"):
        assert command in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("cgroup", ["..", "/etc", "a//b", "governor.slice/../../x"])
def test_monitor_cgroup_outside_the_root_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], cgroup: str
) -> None:
    code, _out, err = run(
        capsys, "--root", RK3588, "monitor", "--cgroup", cgroup, str(POLICY_DIR / "npu-chat.toml")
    )
    assert code == 2
    assert "is not a cgroup below the cgroup2 root" in assert_one_line_error(err)


@pytest.mark.parametrize("value", ["nan", "1e308", "0.01"])
def test_sample_interval_must_be_a_sane_number_of_seconds(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    code, _out, err = run(
        capsys, "monitor", "--sample-interval", value, str(POLICY_DIR / "npu-chat.toml")
    )
    assert code == 2
    assert "--sample-interval" in assert_one_line_error(err)


@pytest.mark.parametrize(
    "argv",
    [
        ("rollback", "chat", "--to", "3", "--all"),
        ("estimate", "model.gguf", "--policy", "p.toml", "--budget", "1G"),
    ],
    ids=["rollback --to --all", "estimate --policy --budget"],
)
def test_mutually_exclusive_options_are_refused_with_2(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    message = assert_one_line_error(err)
    assert "are mutually exclusive" in message


# ---------------------------------------------------------------- [device] and rkllm


def test_check_refuses_an_rkllm_model_the_board_cannot_hold(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The rk3588 fixture has MemAvailable 1544716 kB: a 3 GiB .rkllm file (sparse) is refused
    with 65 naming device.memory, a 100 MiB one passes; the demo's positional MAX_CONTEXT_LEN
    is held to engine.max_context_tokens."""
    policy = tmp_path / "npu.toml"
    policy.write_text('name = "npu"\n[engine]\nkind = "rkllm"\nmax_context_tokens = 2048\n')
    big, small = tmp_path / "big.rkllm", tmp_path / "small.rkllm"
    with big.open("wb") as f:
        f.truncate(3 << 30)
    with small.open("wb") as f:
        f.truncate(100 << 20)
    check = ("--root", RK3588, "check", str(policy), "--engine-argv")
    code, _, err = run(capsys, *check, f"llm_demo {big} 128 2048")
    assert code == 65
    line = assert_one_line_error(err)
    assert "device memory 3GiB (engine.kind = rkllm (the .rkllm file))" in line
    assert line.endswith(f"({policy}, device.memory)")
    code, _, err = run(capsys, *check, f"llm_demo {small} 128 2048")
    assert code == 0, err
    code, _, err = run(capsys, *check, f"llm_demo {small} 128 4096")
    assert code == 65 and "engine.max_context_tokens = 2048" in err
