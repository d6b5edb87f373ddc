"""Where the run directory is (governor/rundir/state.py run_dir): GOVERNOR_RUN_DIR, root's
/run/governor, a user's $XDG_RUNTIME_DIR/governor; never a name in the shared /tmp that
another user could create first. Without XDG_RUNTIME_DIR a non-root user gets 69 and a hint,
and `governor status` / `governor launch` say so before anything is applied.

Needs: nothing (environments are passed in; the CLI runs in a subprocess as this user)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from governor.errors import EXIT_UNAVAILABLE, HostError
from governor.rundir.state import run_dir

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"


def test_the_run_dir_by_environment_and_user() -> None:
    assert run_dir({"GOVERNOR_RUN_DIR": "/x"}, euid=1000) == Path("/x")
    assert run_dir({}, euid=0) == Path("/run/governor")
    assert run_dir({"XDG_RUNTIME_DIR": "/run/user/1000"}, euid=1000) == Path(
        "/run/user/1000/governor"
    )


def test_a_user_without_xdg_runtime_dir_gets_an_error_not_a_tmp_name() -> None:
    with pytest.raises(HostError) as info:
        run_dir({}, euid=1000)
    err = info.value
    assert err.exit_code == EXIT_UNAVAILABLE
    assert "uid 1000" in str(err) and "XDG_RUNTIME_DIR" in str(err)
    assert err.hint is not None and "GOVERNOR_RUN_DIR" in err.hint
    assert "/tmp" not in str(err)
    with pytest.raises(HostError):
        run_dir({"XDG_RUNTIME_DIR": ""}, euid=1000)  # set but empty: not a directory


def test_status_and_launch_without_xdg_runtime_dir_exit_69_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a user (euid 1000) without XDG_RUNTIME_DIR: one error line and its hint, exit 69;
    launch has applied nothing (the cgroup tree is as it was) and started nothing."""
    from governor.main import main

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("GOVERNOR_RUN_DIR", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    cg = tmp_path / "cg"
    shutil.copytree(HOSTS / "cgroup2-full" / "sys" / "fs" / "cgroup", cg)
    before = sorted(str(p.relative_to(cg)) for p in cg.rglob("*"))
    policy = tmp_path / "u.toml"
    policy.write_text('name = "u"\n[memory]\nmax = "64M"\n')
    marker = tmp_path / "started"
    for argv in (
        ["status"],
        [
            "--root", str(HOSTS / "cgroup2-full"), "--cgroup-root", str(cg), "launch",
            "--policy", str(policy), "--", "/bin/touch", str(marker),
        ],
    ):  # fmt: skip
        try:
            code = main(argv)  # the launch path returns its status, the typer path exits
        except SystemExit as exited:
            code = exited.code  # type: ignore[assignment]
        assert code == EXIT_UNAVAILABLE, argv
        err = capsys.readouterr().err.splitlines()
        assert err[0].startswith("governor: no run directory for uid 1000"), err
        assert err[1].startswith("hint: "), err
    assert sorted(str(p.relative_to(cg)) for p in cg.rglob("*")) == before
    assert not marker.exists()
