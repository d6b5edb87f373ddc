"""The engine's executable and the child's set-up, resolved in the parent before anything is
applied (governor/launch/executable.py, governor/launch/child.py): the shell's 127 and 126,
the policy's environment over the governor's, process.user/group looked up (69 when missing)."""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path

import pytest

from governor.errors import HostError, LaunchError
from governor.launch.child import child_setup
from governor.launch.executable import resolve_executable
from governor.plan.model import EngineSpec, LaunchSpec, Plan, PrefetchSpec


def _plan(launch: LaunchSpec) -> Plan:
    return Plan(
        policy="t",
        cgroup_root="/sys/fs/cgroup",
        slice="governor.slice",
        group="governor.slice/t",
        leaf="governor.slice/t/engine",
        create=(),
        enable=(),
        writes=(),
        controllers=(),
        launch=launch,
        engine=EngineSpec(),
        prefetch=PrefetchSpec(),
        watch=(),
        source="/etc/governor/t.toml",
    )


def _tool(directory: Path, name: str, mode: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_an_engine_on_path_is_found_in_the_first_directory_that_holds_it(tmp_path: Path) -> None:
    _tool(tmp_path / "a", "other", 0o755)
    second = _tool(tmp_path / "b", "engine", 0o755)
    _tool(tmp_path / "c", "engine", 0o755)
    path_env = os.pathsep.join(str(tmp_path / d) for d in ("a", "b", "c"))
    assert resolve_executable("engine", path_env) == str(second)


def test_a_missing_engine_is_127_and_a_non_executable_one_126(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as missing:
        resolve_executable("no-such-engine", str(tmp_path))
    assert missing.value.exit_code == 127
    assert str(missing.value) == "engine not found: no-such-engine (-- ENGINE)"
    plain = _tool(tmp_path, "plain", 0o644)
    with pytest.raises(LaunchError) as denied:
        resolve_executable(str(plain), None)
    assert denied.value.exit_code == 126
    assert str(denied.value) == f"engine is not executable: {plain} (-- ENGINE)"
    with pytest.raises(LaunchError) as directory:
        resolve_executable(str(tmp_path), None)
    assert directory.value.exit_code == 126


def test_the_policy_environment_wins_and_pdeathsig_follows_on_governor_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GOVERNOR_T_KEEP", "mine")
    monkeypatch.setenv("GOVERNOR_T_OVER", "mine")
    setup = child_setup(
        _plan(LaunchSpec(env={"GOVERNOR_T_OVER": "policy"}, on_governor_exit="keep")),
        "/bin/true",
        ("true", "-x"),
    )
    assert setup.env["GOVERNOR_T_KEEP"] == "mine"
    assert setup.env["GOVERNOR_T_OVER"] == "policy"
    assert (setup.executable, setup.argv, setup.uid, setup.gid) == (
        "/bin/true",
        ("true", "-x"),
        None,
        None,
    )
    assert setup.pdeathsig is False
    assert child_setup(_plan(LaunchSpec()), "/bin/true", ("true",)).pdeathsig is True


def test_process_user_and_group_are_looked_up_and_set_the_identity_and_home() -> None:
    me = pwd.getpwuid(os.getuid())
    group = grp.getgrgid(os.getgid())
    setup = child_setup(
        _plan(LaunchSpec(user=me.pw_name, group=group.gr_name)), "/bin/true", ("true",)
    )
    assert (setup.uid, setup.gid, setup.user, setup.home) == (
        me.pw_uid,
        group.gr_gid,
        me.pw_name,
        me.pw_dir,
    )
    assert (setup.env["USER"], setup.env["LOGNAME"], setup.env["HOME"]) == (
        me.pw_name,
        me.pw_name,
        me.pw_dir,
    )


@pytest.mark.parametrize(
    ("launch", "line"),
    [
        (
            LaunchSpec(user="governor-no-such-user"),
            "process.user 'governor-no-such-user' does not exist on this host"
            " (/etc/governor/t.toml, process.user; /etc/passwd)",
        ),
        (
            LaunchSpec(group="governor-no-such-group"),
            "process.group 'governor-no-such-group' does not exist on this host"
            " (/etc/governor/t.toml, process.group; /etc/group)",
        ),
    ],
)
def test_a_missing_user_or_group_is_refused_with_where_it_was_looked_up(
    launch: LaunchSpec, line: str
) -> None:
    with pytest.raises(HostError) as err:
        child_setup(_plan(launch), "/bin/true", ("true",))
    assert str(err.value) == line
    assert err.value.exit_code == 69
