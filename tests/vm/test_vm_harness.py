"""Host-tier tests of the guest harness pieces that need no guest: junit judging, the cpio
writer, option parsing, guest scripts and qemu argv."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from vm import harness, initramfs
from vm.junit import Counts, TierResult, format_table, judge_pytest, parse_junit

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="kernel" errors="1" failures="2" skipped="3" tests="10" time="1.0">
<testcase classname="a" name="t" time="0.1"/></testsuite></testsuites>"""


def test_parse_junit_counts(tmp_path: Path) -> None:
    f = tmp_path / "j.xml"
    f.write_text(JUNIT)
    c = parse_junit(f)
    assert (c.tests, c.failures, c.errors, c.skipped, c.passed) == (10, 2, 1, 3, 4)


def test_judge_pytest(tmp_path: Path) -> None:
    f = tmp_path / "j.xml"
    f.write_text(JUNIT)
    assert judge_pytest("k", 0, f, 1.0).ok
    assert not judge_pytest("k", 1, f, 1.0).ok
    missing = judge_pytest("k", None, tmp_path / "none.xml", 1.0)
    assert not missing.ok
    assert any("no exit code" in n for n in missing.notes)
    empty = tmp_path / "e.xml"
    empty.write_text('<testsuites><testsuite tests="0" failures="0" errors="0" skipped="0"/>'
                     "</testsuites>")  # fmt: skip
    no_tests = judge_pytest("k", 5, empty, 1.0)
    assert not no_tests.ok, "pytest exit 5 (no tests collected) must fail the tier"
    assert "no tests collected" in " ".join(no_tests.notes)
    assert not judge_pytest("k", 0, empty, 1.0).ok


def test_format_table() -> None:
    rows = [
        TierResult("host", True, 3.04, Counts(5, 0, 0, 1)),
        TierResult("kernel", False, 70.0, None, ["no exit code came back"]),
    ]
    out = format_table(rows, 80.0)
    lines = out.splitlines()
    assert lines[0].split() == [
        "tier",
        "result",
        "passed",
        "failed",
        "skipped",
        "errors",
        "wall",
        "s",
    ]
    assert lines[2].split() == ["host", "ok", "4", "0", "1", "0", "3.0"]
    assert lines[3].split() == ["kernel", "FAIL", "-", "-", "-", "-", "70.0"]
    assert lines[5].split() == ["total", "FAIL", "80.0"]
    assert "kernel: no exit code came back" in out


def test_newc_archive_lists_with_cpio(tmp_path: Path) -> None:
    if shutil.which("cpio") is None:
        pytest.skip("cpio not installed")
    a = initramfs.Newc()
    a.dir("bin")
    a.file("bin/hello", b"hi there\n", 0o755)
    a.symlink("bin/sh", "hello")
    a.chardev("console", 5, 1)
    img = tmp_path / "x.cpio"
    img.write_bytes(a.tobytes())
    res = subprocess.run(["cpio", "-itv"], stdin=img.open("rb"), capture_output=True, text=True,
                         check=True)  # fmt: skip
    names = [ln.split()[-1] if "->" not in ln else ln.split()[-3] for ln in res.stdout.splitlines()]
    assert names == ["bin", "bin/hello", "bin/sh", "console"]
    assert res.stdout.splitlines()[3].startswith("crw-------")
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["cpio", "-id", "--quiet", "bin/hello"], stdin=img.open("rb"), cwd=out,
                   check=True)  # fmt: skip
    assert (out / "bin/hello").read_bytes() == b"hi there\n"


def test_parse_args_tiers_and_passthrough() -> None:
    o = harness.parse_args([])
    assert o.tiers == ["lint", "host", "kernel", "systemd"]
    assert o.pytest_args == []
    o = harness.parse_args(["--tier", "systemd,kernel", "-k", "oom", "-x"])
    assert o.tiers == ["kernel", "systemd"]
    assert o.pytest_args == ["-k", "oom", "-x"]
    o = harness.parse_args(["--tier", "host", "--tier", "kernel", "--", "--tier-like"])
    assert o.tiers == ["host", "kernel"]
    assert o.pytest_args == ["--tier-like"]
    assert harness.parse_args(["--host-only"]).tiers == ["lint", "host"]
    with pytest.raises(SystemExit):
        harness.parse_args(["--tier", "bogus"])


def test_guest_script_exports_ci_and_writes_rc() -> None:
    s = harness.guest_script("kernel", "/res/kernel", ["-k", "a b"], environ={"CI": "true",
                             "SECRET_TOKEN": "x", "GOVERNOR_FOO": "1"})  # fmt: skip
    assert "export CI=true\n" in s
    assert "export GOVERNOR_TEST_TIER=kernel\n" in s
    assert "export GOVERNOR_FOO=1\n" in s
    assert "SECRET_TOKEN" not in s
    assert "-m kernel tests/kernel --junitxml=/res/kernel/junit.xml" in s
    assert "-k 'a b'" in s
    assert "-p no:hypothesispytest" in s, "hypothesis's plugin costs ~25 s of a TCG guest's start"
    assert "echo $rc > /res/kernel/rc" in s
    bash = shutil.which("bash")
    assert bash is not None
    subprocess.run([bash, "-n", "-c", s], check=True)


def test_systemd_guest_pieces_are_valid_bash_and_mask_tmp() -> None:
    stage2 = harness.systemd_stage2()
    assert "ln -sf /dev/null /run/systemd/system/tmp.mount" in stage2
    assert "ln -sf /dev/null /run/systemd/system/systemd-tmpfiles-setup.service" in stage2
    assert "Delegate=yes" in stage2
    assert "Type=oneshot" in stage2
    for script in (stage2, harness.PLAIN_STAGE2, harness.GUEST_RUNCMD, initramfs.STAGE1_INIT):
        subprocess.run(["bash", "-n", "-c", script], check=True)
    assert "busybox poweroff -f" in harness.GUEST_RUNCMD


def test_qemu_argv(tmp_path: Path) -> None:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu not installed")
    k, i = tmp_path / "vmlinuz-1", tmp_path / "initrd"
    argv = harness.qemu_systemd_argv(k, i, tmp_path, accel="tcg", cpus=4, memory_mib=2048)
    joined = " ".join(argv)
    assert "-accel tcg,thread=multi -cpu max" in joined
    assert "-smp 4" in joined
    assert "-m 2048M" in joined
    assert "path=/,security_model=none,readonly=on" in joined
    assert f"file,id=out,path={tmp_path}/output.log" in joined
    kvm = harness.qemu_systemd_argv(k, i, tmp_path, accel="kvm", cpus=2, memory_mib=512)
    assert "-accel kvm -cpu host" in " ".join(kvm)
    with pytest.raises(RuntimeError, match="cannot contain"):
        harness.qemu_systemd_argv(k, i, tmp_path / "a,b", accel="tcg", cpus=1, memory_mib=1)


def test_detect_accel_honours_request_and_cache(tmp_path: Path) -> None:
    assert harness.detect_accel(Path("/nonexistent"), tmp_path, "tcg") == ("tcg", "requested")
    assert harness.detect_accel(Path("/nonexistent"), tmp_path, "kvm") == ("kvm", "requested")


def test_find_kernel_prefers_env_and_sorts_versions() -> None:
    assert harness.find_kernel({"GOVERNOR_VM_KERNEL": "/k/vmlinuz-9"}) == Path("/k/vmlinuz-9")
    assert harness.kernel_version(Path("/boot/vmlinuz-6.1.0-57-amd64")) == "6.1.0-57-amd64"


def test_kernel_tier_boots_the_fast_qemu_guest_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOVERNOR_KERNEL_VM", raising=False)
    assert harness.parse_args([]).kernel_vm == "qemu"
    assert harness.parse_args(["--kernel-vm", "vng"]).kernel_vm == "vng"
    monkeypatch.setenv("GOVERNOR_KERNEL_VM", "vng")
    assert harness.parse_args([]).kernel_vm == "vng"


def test_precompile_writes_bytecode_the_guest_can_read(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "sub" / "mod.py").write_text("Y = 2\n")
    assert harness.precompile(tmp_path, ("pkg", "absent")) is None
    assert list((pkg / "__pycache__").glob("__init__.cpython-*.pyc"))
    assert list((pkg / "sub" / "__pycache__").glob("mod.cpython-*.pyc"))
    (pkg / "bad.py").write_text("def (:\n")
    why = harness.precompile(tmp_path, ("pkg",))
    assert why is not None and "bad.py" in why


def test_precompile_fills_pytests_rewrite_cache(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_x.py").write_text("def test_x() -> None:\n    assert 1\n")
    (tmp_path / "t" / "conftest.py").write_text("")
    assert harness.precompile(tmp_path, (), ("t",)) is None
    cached = sorted(
        p.name.split(".")[0] for p in (tmp_path / "t" / "__pycache__").glob("*-pytest-*.pyc")
    )
    assert cached == ["conftest", "test_x"]


def _fake_tiers(
    monkeypatch: pytest.MonkeyPatch, *, kernel_ok: bool = True, parallel: bool = True
) -> list[tuple[str, str]]:
    """Tiers that record when they start and end. In parallel mode the fake kernel guest
    ends only once the systemd tier has ended (an event, not a sleep: no timing involved);
    if the harness did not overlap them, it gives up after 30 s and the order shows it."""
    import threading

    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    systemd_done = threading.Event()

    def fake(tier: str, ok: bool = True) -> TierResult:
        with lock:
            events.append(("start", tier))
        if tier == "kernel" and parallel:
            systemd_done.wait(timeout=30)
        with lock:
            events.append(("end", tier))
        if tier == "systemd":
            systemd_done.set()
        return TierResult(tier, ok=ok, wall=0.0, counts=Counts(tests=1))

    monkeypatch.setattr(harness, "find_kernel", lambda: Path("/boot/vmlinuz-fake"))
    monkeypatch.setattr(harness, "detect_accel", lambda *_a: ("tcg", "requested"))
    monkeypatch.setattr(harness, "precompile", lambda **_k: None)
    monkeypatch.setattr(harness, "tier_lint", lambda _o: fake("lint"))
    monkeypatch.setattr(harness, "tier_host", lambda _o: fake("host"))
    monkeypatch.setattr(
        harness, "tier_qemu", lambda _o, tier, *_a: fake(tier, kernel_ok or tier != "kernel")
    )
    return events


def test_the_kernel_guest_runs_alongside_the_other_tiers_and_its_result_counts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = _fake_tiers(monkeypatch)
    assert harness.main(["--parallel", "--results", str(tmp_path / "r")]) == 0
    # the others started and ended while the kernel guest ran
    assert events.index(("start", "kernel")) < events.index(("end", "systemd"))
    assert events[-1] == ("end", "kernel")
    table = capsys.readouterr().out
    assert [
        ln.split()[0]
        for ln in table.splitlines()
        if ln.split()[:1] in (["lint"], ["host"], ["kernel"], ["systemd"])
    ][-4:] == ["lint", "host", "kernel", "systemd"]
    # a failing kernel guest fails the run, as it does when serial
    _fake_tiers(monkeypatch, kernel_ok=False)
    assert harness.main(["--parallel", "--results", str(tmp_path / "r2")]) == 1


def test_serial_runs_one_tier_at_a_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    events = _fake_tiers(monkeypatch, parallel=False)
    assert harness.main(["--results", str(tmp_path / "r")]) == 0
    assert events == [
        (e, t) for t in ("lint", "host", "kernel", "systemd") for e in ("start", "end")
    ]
