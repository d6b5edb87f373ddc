"""Host-tier tests of the requirement markers (tests/vm/requirements.py): no guest needed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vm import requirements as rq

HOST_MOUNTINFO = """\
22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 22 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
35 31 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
"""
GUEST_MOUNTINFO = """\
24 23 0:22 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sys rw
30 24 0:24 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw
"""
ALL = "cpuset cpu io memory hugetlb pids rdma misc"


def fake_host(
    tmp_path: Path,
    *,
    mountinfo: str = GUEST_MOUNTINFO,
    controllers: dict[str, str] | None = None,
    psi: bool = True,
    pid1: str = "systemd",
    euid: int = 0,
    systemctl: str | None = "systemd 252 (252.39-1~deb12u2)\n+PAM +AUDIT\n",
) -> rq.Probe:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    (proc / "1").mkdir()
    (proc / "1" / "comm").write_text(pid1 + "\n")
    if psi:
        (proc / "pressure").mkdir()
        for r in ("cpu", "memory", "io"):
            (proc / "pressure" / r).write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    for mp, ctrls in (controllers or {"/sys/fs/cgroup": ALL}).items():
        d = tmp_path / mp.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.controllers").write_text(ctrls + "\n")
    return rq.Probe(proc=proc, fs_root=tmp_path, geteuid=lambda: euid, systemctl=lambda: systemctl)


def test_cgroup2_mounts_parses_mountinfo_and_escapes() -> None:
    text = HOST_MOUNTINFO + "40 22 0:40 / /mnt/with\\040space rw - cgroup2 none rw\n"
    assert rq.cgroup2_mounts(text) == [Path("/sys/fs/cgroup/unified"), Path("/mnt/with space")]


def test_full_guest_meets_the_kernel_requirement(tmp_path: Path) -> None:
    probe = fake_host(tmp_path)
    assert rq.kernel_reasons(probe=probe) == []
    path, why = rq.find_cgroup2_root(("memory",), probe)
    assert path == tmp_path / "sys/fs/cgroup"
    assert why == ""


def test_hybrid_host_lacks_controllers(tmp_path: Path) -> None:
    probe = fake_host(
        tmp_path, mountinfo=HOST_MOUNTINFO, controllers={"/sys/fs/cgroup/unified": ""}
    )
    reasons = rq.kernel_reasons(controllers=("memory", "cpuset"), probe=probe)
    assert len(reasons) == 1
    assert "/sys/fs/cgroup/unified lacks controller(s) memory cpuset" in reasons[0]
    assert rq.kernel_reasons(controllers=(), probe=probe) == []


def test_no_cgroup2_no_root_no_psi_are_all_reported(tmp_path: Path) -> None:
    probe = fake_host(
        tmp_path, mountinfo="1 0 0:1 / / rw - ext4 /dev/sda rw\n", psi=False, euid=1000
    )
    reasons = rq.kernel_reasons(probe=probe)
    assert [r.split()[0] for r in reasons] == ["no", "needs", "PSI"]


def test_systemd_requirement(tmp_path: Path) -> None:
    assert rq.systemd_reasons(probe=fake_host(tmp_path / "a")) == []
    assert "not systemd" in rq.systemd_reasons(probe=fake_host(tmp_path / "b", pid1="init"))[0]
    old = fake_host(tmp_path / "c", systemctl="systemd 247 (247.3-7)\n")
    assert rq.systemd_reasons(min_version=252, probe=old) == ["systemd 247 < required 252"]
    broken = fake_host(tmp_path / "d", systemctl=None)
    assert rq.systemd_reasons(probe=broken) == ["`systemctl --version` failed"]
    assert rq.parse_systemd_version("systemd 256 (256.5-1)") == 256


def test_engine_requirement(tmp_path: Path) -> None:
    exe = tmp_path / "llama-cli"
    exe.write_text("")
    assert rq.engine_reasons(binary=exe) == []
    assert rq.engine_reasons(binary="sh") == []  # a name on PATH
    assert rq.engine_reasons(binary=tmp_path / "nope") == [
        f"engine binary {tmp_path}/nope not found"
    ]
    assert rq.engine_reasons(env="LLAMA_BIN", environ={}) == [
        "environment variable LLAMA_BIN (engine binary) is not set"
    ]
    assert rq.engine_reasons(env="LLAMA_BIN", environ={"LLAMA_BIN": str(exe)}) == []
    assert rq.engine_reasons(paths=[tmp_path / "m.gguf"]) == [f"{tmp_path}/m.gguf does not exist"]


@pytest.mark.parametrize(
    ("ci", "expected"),
    [("", "skip"), ("false", "skip"), ("true", "fail"), ("1", "fail"), ("TRUE", "fail")],
)
def test_missing_requirement_skips_locally_and_fails_in_ci(ci: str, expected: str) -> None:
    kind = pytest.fail.Exception if expected == "fail" else pytest.skip.Exception
    with pytest.raises(kind, match="missing requirement: no cgroup2"):
        rq.enforce(["no cgroup2"], environ={"CI": ci})
    rq.enforce([], environ={"CI": ci})  # nothing missing: neither


TEST_FILE = """
import pytest

@pytest.mark.kernel(controllers=("no-such-controller",))
def test_needs_kernel():
    pass

@pytest.mark.systemd(min_version=100000)
def test_needs_systemd():
    pass

@pytest.mark.engine(binary="/nonexistent/llama-cli")
def test_needs_engine():
    pass

def test_plain():
    pass
"""


@pytest.mark.parametrize("ci", [None, "true"])
def test_hook_end_to_end_in_a_pytest_subprocess(tmp_path: Path, ci: str | None) -> None:
    """The real hook in a real pytest run: three skips locally, three setup errors with CI=true."""
    (tmp_path / "test_reqs.py").write_text(TEST_FILE)
    (tmp_path / "pytest.ini").write_text(
        textwrap.dedent("""\
        [pytest]
        markers =
            kernel: k
            systemd: s
            engine: e
        """)
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(Path(rq.__file__).resolve().parents[1])
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "vm.requirements", "-p", "no:cacheprovider",
         "-rA", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False,
    )  # fmt: skip
    tail = res.stdout.splitlines()[-1]
    if ci is None:
        assert res.returncode == 0, res.stdout
        assert "1 passed, 3 skipped" in tail, res.stdout
    else:
        assert res.returncode == 1, res.stdout
        assert "1 passed, 3 errors" in tail, res.stdout  # setup failures count as errors
        assert "CI=true turns this skip into a failure" in res.stdout
