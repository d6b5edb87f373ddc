"""`governor monitor POLICY`: attach to a running slice (here: a fake tree, where the monitor
polls), or refuse with exit 69 when there is nothing to attach to. Needs: a tmp directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from governor.cli import main

from .fakekernel import FakeKernelCgroupFs

REPO = Path(__file__).resolve().parents[2]
HOST = str(REPO / "tests" / "fixtures" / "hosts" / "cgroup2-full")
POLICY = """\
name = "chat"
[[pressure]]
when = "memory some 150ms/2s"
do = ["log"]
[[pressure]]
when = "oom_kill"
do = ["log"]
"""


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    assert isinstance(info.value.code, int)
    return info.value.code, out, err


def test_monitor_refuses_a_slice_that_is_not_running(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cgroup_root: Path
) -> None:
    policy = tmp_path / "chat.toml"
    policy.write_text(POLICY)
    code, _, err = _run(
        capsys, "--root", HOST, "--cgroup-root", str(cgroup_root), "monitor", str(policy)
    )
    assert code == 69, err
    assert "nothing to monitor" in err and "Traceback" not in err


def test_monitor_attaches_reports_and_stops_after_its_duration(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    cgroup_root: Path,
    fake_fs: FakeKernelCgroupFs,
) -> None:
    policy = tmp_path / "chat.toml"
    policy.write_text(POLICY)
    for cg in ("governor.slice", "governor.slice/chat"):
        fake_fs.mkdir(cg)
    report = tmp_path / "m.json"
    code, out, err = _run(
        capsys, "--root", HOST, "--cgroup-root", str(cgroup_root),
        "monitor", str(policy), "--duration", "0.3", "--sample-interval", "0.1",
        "--report", str(report),
    )  # fmt: skip
    assert code == 0, err
    assert "0 rule firing(s), 0 oom_kill seen" in out
    data = json.loads(report.read_text())
    assert [r["when"] for r in data["rules"]] == ["memory some 150ms/2s", "oom_kill"]
    assert data["psi"][0]["mode"] == "polled"
    assert data["sampler"]["samples"] >= 2
