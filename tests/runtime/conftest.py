"""Run-time tier on the host: real `governor launch` processes on the host's cgroup2 mount.

The host (a developer's machine, CI) may be hybrid: its cgroup2 mount then has no memory, cpu,
cpuset, io or pids controller, so every launch here passes ``--allow-missing`` for all of them
and exercises what needs no controller: mkdir/rmdir, cgroup.procs, clone3 into a cgroup,
cgroup.kill, cgroup.events, PSI files and triggers. Nothing is written under a cgroup v1 mount.

Requirements (checked before each test; a missing one fails under CI=true, else skips): root,
a cgroup2 mount, PSI. Every launch runs in a scratch slice (``gtest-<hex>.slice``, the
`scratch_slice` fixture) that is killed and removed at teardown, with its own plan cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.cgroups import ScratchSlice
from vm import requirements

from governor.compile.compiler import LEAF

REPO = Path(__file__).resolve().parents[2]
ALLOW_MISSING = "memory,cpu,cpuset,io,pids"  # none of them is needed for what is tested here
NAME = "rt"  # the policies' name: the group is <slice>/rt

RUN_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def _host_requirements() -> None:
    requirements.enforce(requirements.kernel_reasons(controllers=(), root=True, psi=True))


@dataclass
class Run:
    """A finished `governor launch`."""

    code: int
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines of stderr (the announce lines and tracebacks are not JSON)."""
        out = []
        for line in self.stderr.splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def event_names(self) -> list[str]:
        return [e["event"] for e in self.events]

    def has(self, event: str) -> bool:
        return event in self.event_names()


@dataclass
class Governor:
    """`python -m governor` from this checkout, with a private plan cache."""

    cgroup_root: Path
    slice: ScratchSlice
    cache: Path
    workdir: Path

    @property
    def group(self) -> Path:
        return self.slice.path / NAME

    @property
    def leaf(self) -> Path:
        return self.group / LEAF

    def policy(
        self, body: str = "", *, file: str = "policy.toml", extends: str | None = None
    ) -> Path:
        """A policy file in the workdir in the scratch slice; ``body`` is TOML after the name."""
        head = f'extends = "{extends}"\n' if extends is not None else ""
        head += f'name = "{NAME}"\nslice = "{self.slice.name}"\n'
        path = self.workdir / file
        path.write_text(head + body)
        return path

    def env(self, cache: Path | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["GOVERNOR_CACHE_DIR"] = str(cache or self.cache)
        return env

    def args(self, policy: Path, engine: Sequence[str], *options: str) -> list[str]:
        """The command line after `governor` (for governor.main.main or a subprocess)."""
        return [
            "--debug",
            "--cgroup-root",
            str(self.cgroup_root),
            "launch",
            "--allow-missing",
            ALLOW_MISSING,
            "-p",
            str(policy),
            *options,
            "--",
            *engine,
        ]

    def start(
        self, policy: Path, engine: Sequence[str], *options: str, cache: Path | None = None
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "governor", *self.args(policy, engine, *options)],
            cwd=self.workdir,
            env=self.env(cache),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(
        self, policy: Path, engine: Sequence[str], *options: str, cache: Path | None = None
    ) -> Run:
        p = self.start(policy, engine, *options, cache=cache)
        out, err = p.communicate(timeout=RUN_TIMEOUT_S)
        return Run(p.returncode, out, err)


@pytest.fixture
def governor(cgroup2_root: Path, scratch_slice: ScratchSlice, tmp_path: Path) -> Iterator[Governor]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    yield Governor(cgroup2_root, scratch_slice, tmp_path / "cache", workdir)
