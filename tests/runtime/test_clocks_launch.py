"""[clocks] with real launches on the host's cgroup2 mount, against a copy of the rk3588
fixture's clock tree (--sysfs-root): the engine runs with the clocks set and they are restored
exactly when it exits; SIGKILL of the governor leaves the restore to the watchdog; a second
policy asking other clocks of the same device exits 65 naming the holder, with nothing applied;
`governor apply` holds the clocks until `governor remove`.

Needs what tests/runtime/conftest.py says (root, a cgroup2 mount, PSI), /bin/sh."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.clocks import DMC, POLICY4, board, read, snapshot

from .conftest import ALLOW_MISSING, Governor, Run

CLOCKS = '[clocks]\nbig = { governor = "performance", min = "max" }\ndmc = "performance"\n'


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return board(tmp_path)


def _policy(governor: Governor, name: str, body: str) -> Path:
    path = governor.workdir / f"{name}.toml"
    path.write_text(f'name = "{name}"\nslice = "{governor.slice.name}"\n{body}')
    return path


def _argv(governor: Governor, sysfs: Path, *command: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "governor",
        "--cgroup-root",
        str(governor.cgroup_root),
        "--sysfs-root",
        str(sysfs),
        *command,
    ]


def _env(governor: Governor, run_dir: Path) -> dict[str, str]:
    return {**governor.env(), "GOVERNOR_RUN_DIR": str(run_dir)}


def _launch(
    governor: Governor, sysfs: Path, run_dir: Path, policy: Path, *engine: str
) -> subprocess.Popen[str]:
    argv = _argv(governor, sysfs, "launch", "--allow-missing", ALLOW_MISSING, "-p", str(policy))
    return subprocess.Popen(
        [*argv, "--", *engine],
        cwd=governor.workdir,
        env=_env(governor, run_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_engine_runs_with_the_clocks_and_they_are_restored_at_exit(
    governor: Governor, sysfs: Path, tmp_path: Path
) -> None:
    before = snapshot(sysfs)
    seen = tmp_path / "seen"
    files = f"{sysfs / POLICY4}/scaling_governor {sysfs / POLICY4}/scaling_min_freq"
    # a fixture file has no trailing newline once written: one line each, as sysfs reads
    engine = (
        "/bin/sh",
        "-c",
        f"for f in {files} {sysfs / DMC}/governor; do cat $f; echo; done > {seen}",
    )
    p = _launch(governor, sysfs, tmp_path / "run", _policy(governor, "chat", CLOCKS), *engine)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert seen.read_text().split() == ["performance", "2352000", "performance"]
    assert snapshot(sysfs) == before
    assert [e["event"] for e in Run(0, out, err).events].count("clocks.restored") == 3


def test_sigkill_of_the_governor_leaves_the_restore_to_the_watchdog(
    governor: Governor, sysfs: Path, tmp_path: Path
) -> None:
    before = snapshot(sysfs)
    run_dir = tmp_path / "run"
    p = _launch(governor, sysfs, run_dir, _policy(governor, "chat", CLOCKS), "sleep", "60")
    try:
        cgroups.wait_for(
            lambda: read(sysfs, DMC, "governor") == "performance", 60, "the clocks to be set"
        )
        cgroups.wait_for(lambda: governor.slice.child("chat/engine", create=False).is_dir(), 30,
                         "the engine's leaf")  # fmt: skip
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        cgroups.wait_for(lambda: snapshot(sysfs) == before, 30, "the watchdog's restore")
    finally:
        if p.poll() is None:
            p.kill()
        _, err = p.communicate(timeout=60)  # EOF once the watchdog has exited
    gone = [e for e in Run(-9, "", err).events if e["event"] == "watchdog.governor_gone"]
    assert [e["action"] for e in gone] == ["kill", "restore clocks"]
    assert not (run_dir / "clocks.json").exists()


def test_other_clocks_of_a_held_device_are_refused_and_apply_holds_until_remove(
    governor: Governor, sysfs: Path, tmp_path: Path
) -> None:
    before = snapshot(sysfs)
    run_dir = tmp_path / "run"
    env = _env(governor, run_dir)
    chat = _policy(governor, "chat", 'process.oom_score_adj = 0\n[clocks]\ndmc = "performance"\n')
    applied = subprocess.run(
        _argv(governor, sysfs, "apply", str(chat)),
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    batch = _policy(governor, "batch", '[clocks]\ndmc = "powersave"\n')
    p = _launch(governor, sysfs, run_dir, batch, "/bin/true")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 65, err
    assert "governor: devfreq dmc is held by policy chat (governor apply)" in err
    assert f"({batch}, clocks.dmc)" in err
    assert not governor.slice.child("batch", create=False).exists()  # nothing applied
    assert read(sysfs, DMC, "governor") == "performance"

    status = subprocess.run(
        _argv(governor, sysfs, "status", "chat"),
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "clock    dmc    dmc           governor          performance performance  in sync" in (
        status.stdout
    )
    removed = subprocess.run(
        _argv(governor, sysfs, "remove", str(chat)),
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    assert snapshot(sysfs) == before


def test_under_keep_the_engine_runs_on_and_the_watchdog_restores_the_clocks(
    governor: Governor, sysfs: Path, tmp_path: Path
) -> None:
    """on_governor_exit = "keep": a SIGKILLed governor leaves its engine running, and its
    watchdog (forked for the clocks alone) gives the board's clocks back."""
    before = snapshot(sysfs)
    run_dir = tmp_path / "run"
    body = '[process]\non_governor_exit = "keep"\n' + CLOCKS
    p = _launch(governor, sysfs, run_dir, _policy(governor, "kept", body), "sleep", "60")
    leaf = governor.slice.child("kept/engine", create=False)
    try:
        cgroups.wait_for(
            lambda: read(sysfs, DMC, "governor") == "performance", 60, "the clocks to be set"
        )
        # The clocks are set before the engine's leaf is made: wait for the leaf as well.
        cgroups.wait_for(
            lambda: leaf.exists() and cgroups.pids(leaf) != [], 30, "the engine in its leaf"
        )
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        cgroups.wait_for(lambda: snapshot(sysfs) == before, 30, "the watchdog's restore")
        assert cgroups.pids(leaf) != [], "the engine did not run on"
    finally:
        if p.poll() is None:
            p.kill()
        # the engine that ran on holds the governor's stderr open: end it before reading
        for pid in cgroups.pids(leaf) if leaf.is_dir() else []:
            os.kill(pid, signal.SIGKILL)
        _, err = p.communicate(timeout=60)
    gone = [e for e in Run(-9, "", err).events if e["event"] == "watchdog.governor_gone"]
    assert [e["action"] for e in gone] == ["restore clocks"]
    assert not (run_dir / "clocks.json").exists()
