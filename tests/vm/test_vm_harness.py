"""Host-tier tests of the guest harness pieces that need no guest: junit judging, the cpio
writer, option parsing, guest scripts and qemu argv."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from vm import harness, initramfs, skips
from vm.junit import (
    Case,
    Counts,
    TierResult,
    format_durations,
    format_table,
    judge_budget,
    judge_pytest,
    parse_cases,
    parse_junit,
)

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
        "cpu",
        "s",
        "budget",
        "s",
    ]
    assert lines[2].split() == ["host", "ok", "4", "0", "1", "0", "3.0", "-", "-"]
    assert lines[3].split() == ["kernel", "FAIL", "-", "-", "-", "-", "70.0", "-", "-"]
    assert lines[5].split() == ["total", "FAIL", "80.0"]
    assert "kernel: no exit code came back" in out


def test_a_tier_over_its_budget_fails_under_ci_and_is_a_note_otherwise() -> None:
    def host(wall: float) -> TierResult:
        return TierResult("host", True, wall, Counts(5, 0, 0, 0))

    over = judge_budget(host(421.0), 420.0, ci=True)
    assert not over.ok and over.budget == 420.0
    assert over.notes and "took 421s, over its budget of 420s" in over.notes[0]
    assert "fails the tier (CI=true)" in over.notes[0]
    local = judge_budget(host(421.0), 420.0, ci=False)
    assert local.ok and "would fail it under CI=true" in local.notes[0]
    at = judge_budget(host(420.0), 420.0, ci=True)
    assert at.ok and not at.notes, "a tier exactly at its budget passes"
    free = judge_budget(host(9999.0), None, ci=True)
    assert free.ok and not free.notes and free.budget is None
    failed = judge_budget(TierResult("host", False, 10.0, notes=["pytest exit 1"]), 420.0, ci=True)
    assert not failed.ok and failed.notes == ["pytest exit 1"]


def test_the_summary_table_and_duration_report_show_budget_against_measured() -> None:
    rows = [
        judge_budget(TierResult("lint", True, 12.0, Counts(4, 0, 0, 0)), 60.0, ci=True),
        judge_budget(TierResult("host", True, 500.0, Counts(5, 0, 0, 0)), 420.0, ci=True),
    ]
    table = format_table(rows, 512.0).splitlines()
    assert table[2].split() == ["lint", "ok", "4", "0", "0", "0", "12.0", "-", "60"]
    assert table[3].split() == ["host", "FAIL", "5", "0", "0", "0", "500.0", "-", "420"]
    assert "host: took 500s, over its budget of 420s" in "\n".join(table)
    report = format_durations(rows, 512.0).splitlines()
    assert report[1].split() == ["tier", "lint", "12.0", "(budget", "60s)"]
    assert report[2].split() == ["tier", "host", "500.0", "(budget", "420s", "OVER)"]


def test_a_tiers_cpu_time_is_its_process_s_rusage_and_the_report_says_how_many_cores(
    tmp_path: Path,
) -> None:
    """A guest tier's qemu CPU time beside its wall time says whether the guest keeps both host
    cores busy (if not, a host tier could run beside it): run_streamed reads it from wait4's
    rusage, a busy child's and a sleeping one's apart, a grandchild's counted once reaped."""
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    busy = harness.run_streamed([sys.executable, "-c", spin], tmp_path / "busy.log", timeout=60)
    assert busy.rc == 0 and busy.cpu is not None and busy.cpu >= 0.35, busy
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"
    tree = harness.run_streamed([sys.executable, "-c", child], tmp_path / "tree.log", timeout=60)
    assert tree.rc == 0 and tree.cpu is not None and tree.cpu >= 0.35, tree
    idle = harness.run_streamed(["sleep", "0.5"], tmp_path / "idle.log", timeout=60)
    assert idle.rc == 0 and idle.wall >= 0.45 and idle.cpu is not None and idle.cpu < 0.2, idle
    failed = harness.run_streamed(["sh", "-c", "exit 3"], tmp_path / "rc.log", timeout=60)
    assert failed.rc == 3
    hung = harness.run_streamed(["sleep", "30"], tmp_path / "hung.log", timeout=0.5)
    assert hung.rc is None and hung.cpu is None and hung.wall < 25
    kernel = TierResult("kernel", True, 100.0, Counts(1, 0, 0, 0), cpu=180.0)
    host = TierResult("host", True, 50.0, Counts(1, 0, 0, 0))
    table = format_table([kernel, host], 150.0).splitlines()
    assert table[2].split() == ["kernel", "ok", "1", "0", "0", "0", "100.0", "180.0", "-"]
    assert table[3].split()[6:] == ["50.0", "-", "-"]
    report = format_durations([kernel, host], 150.0).splitlines()
    assert report[1].split() == ["tier", "kernel", "100.0", "cpu", "180.0s", "=", "1.80", "cores"]
    assert report[2].split() == ["tier", "host", "50.0"]


def test_budgets_hold_only_ci_s_configuration(tmp_path: Path) -> None:
    """The budgets were measured for the default run; --full, another kernel, arm64, vng and
    --parallel are slower by design and are held to their timeouts only."""
    r = ["--results", str(tmp_path)]
    assert harness.parse_args(r).budgets == harness.TIER_BUDGETS
    assert harness.parse_args([*r, "--tier", "kernel", "-k", "oom"]).budgets["kernel"] > 0
    for other in (["--full"], ["--kernel", "5.10"], ["--arch", "arm64"],
                  ["--kernel-vm", "vng"], ["--parallel"]):  # fmt: skip
        assert harness.parse_args([*r, *other]).budgets == {}, other


def test_a_run_whose_tier_passes_its_budget_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every test passed, but the host tier took longer than its budget: with CI=true the run
    fails and the summary says which tier, by how much; without CI it passes with the note."""
    _fake_tiers(monkeypatch, parallel=False)
    slow = harness.TIER_BUDGETS["host"] + 1
    monkeypatch.setattr(
        harness, "tier_host", lambda _o: TierResult("host", True, slow, counts=Counts(tests=1))
    )
    argv = ["--tier", "lint,host", "--results", str(tmp_path / "r")]
    monkeypatch.setenv("CI", "true")
    assert harness.main(argv) == 1
    out = capsys.readouterr().out
    table = out[out.index("\ntier ") + 1 :].splitlines()
    assert table[3].split()[:2] == ["host", "FAIL"]
    assert table[3].split()[-3:] == [f"{slow:.1f}", "-", f"{harness.TIER_BUDGETS['host']:.0f}"]
    assert f"host: took {slow:.0f}s, over its budget" in out
    monkeypatch.setenv("CI", "false")
    assert harness.main(argv) == 0
    assert "would fail it under CI=true" in capsys.readouterr().out


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
    # the default run (CI) includes the compat tests on Debian's 5.10 and 6.18 (issues 37, 47)
    assert o.tiers == ["lint", "host", "kernel", "systemd", "compat-5.10", "compat-6.18"]
    assert o.pytest_args == []
    assert o.kernel_series is None
    o = harness.parse_args(["--tier", "systemd,kernel", "-k", "oom", "-x"])
    assert o.tiers == ["kernel", "systemd"]
    assert o.pytest_args == ["-k", "oom", "-x"]
    o = harness.parse_args(["--tier", "host", "--tier", "kernel", "--", "--tier-like"])
    assert o.tiers == ["host", "kernel"]
    assert o.pytest_args == ["--tier-like"]
    assert harness.parse_args(["--host-only"]).tiers == ["lint", "host"]
    with pytest.raises(SystemExit):
        harness.parse_args(["--tier", "bogus"])


def test_kernel_option_boots_the_guest_tiers_on_that_series_and_compat_runs_its_own() -> None:
    o = harness.parse_args(["--kernel", "5.10"])
    assert (o.tiers, o.kernel_series) == (["kernel", "systemd"], "5.10")
    o = harness.parse_args(["--kernel", "6.12", "--tier", "systemd"])
    assert (o.tiers, o.kernel_series) == (["systemd"], "6.12")
    assert harness.tier_series("kernel", "6.12") == "6.12"
    assert harness.tier_series("systemd", None) is None  # the newest /boot/vmlinuz-*
    assert harness.tier_series("compat-5.10", "6.12") == "5.10"  # compat tiers: their own
    assert harness.parse_args(["--tier", "compat"]).tiers == ["compat-5.10", "compat-6.18"]
    assert harness.parse_args(["--tier", "compat-6.12,host"]).tiers == ["host", "compat-6.12"]
    with pytest.raises(SystemExit):
        harness.parse_args(["--kernel", "4.19"])


def test_the_mainline_kernels_are_in_the_matrix_and_the_older_ones_opt_in() -> None:
    # issue 47: 6.18 (the mainline LTS of RK3588 boards) and 7.x (Armbian edge)
    o = harness.parse_args(["--kernel", "7.x"])
    assert (o.tiers, o.kernel_series) == (["kernel", "systemd"], "7.x")
    assert harness.parse_args(["--kernel", "6.18"]).kernel_series == "6.18"
    o = harness.parse_args(["--tier", "compat-7.x,compat-6.12"])
    assert o.tiers == ["compat-6.12", "compat-7.x"]
    assert [harness.tier_series(t) for t in o.tiers] == ["6.12", "7.x"]
    assert harness.tier_suite("compat-7.x") == ("kernel", "kernel and compat")
    assert "GOVERNOR_TEST_COMPAT=7.x" in harness.guest_script("compat-7.x", "/r", [], environ={})
    # opt-in: named, never in the default run (6.12 is Debian 13's; CI has 5.10 and 6.18)
    assert not {"compat-6.1", "compat-6.12", "compat-7.x"} & set(harness.parse_args([]).tiers)


def test_a_compat_tier_runs_the_kernel_tests_marked_compat() -> None:
    s = harness.guest_script("compat-5.10", "/res/c", [], environ={})
    assert "-m 'kernel and compat and not full' tests/kernel --junitxml=/res/c/junit.xml" in s
    assert "export GOVERNOR_TEST_TIER=kernel\n" in s  # the kernel tier's tests, as there


def test_series_kernel_fetches_once_through_scripts_kernels(tmp_path: Path) -> None:
    script = tmp_path / "scripts" / "kernels"
    script.parent.mkdir()
    cache = tmp_path / "cache"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path}/calls\n'
        f'if [ "$1" = --path ]; then [ -e {cache}/$2 ] && echo {cache}/$2/vmlinuz; exit $?; fi\n'
        f"mkdir -p {cache}/$1\n"
    )
    script.chmod(0o755)
    assert harness.series_kernel("5.10", root=tmp_path) == cache / "5.10" / "vmlinuz"
    assert harness.series_kernel("5.10", root=tmp_path) == cache / "5.10" / "vmlinuz"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["--path 5.10", "5.10", "--path 5.10", "--path 5.10"]
    script.write_text("#!/bin/sh\necho 'kernels: no network' >&2; exit 1\n")
    with pytest.raises(
        RuntimeError, match=re.escape("cannot fetch kernel 6.12: kernels: no network")
    ):
        harness.series_kernel("6.12", root=tmp_path)


def test_guest_script_exports_ci_and_writes_rc() -> None:
    s = harness.guest_script("kernel", "/res/kernel", ["-k", "a b"], environ={"CI": "true",
                             "SECRET_TOKEN": "x", "GOVERNOR_FOO": "1"})  # fmt: skip
    assert "export CI=true\n" in s
    assert "export GOVERNOR_TEST_TIER=kernel\n" in s
    assert "export GOVERNOR_FOO=1\n" in s
    assert "SECRET_TOKEN" not in s
    assert "-m 'kernel and not full' tests/kernel --junitxml=/res/kernel/junit.xml" in s
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
    assert 'ln -sf /dev/null "/run/systemd/system-generators/${g##*/}"' in stage2
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
    # 6.18 and 7.x under TCG boot with their sched_clock unstable from the start (no static key
    # flip in the idle loop: the int3 oops of issue 47); the other series and KVM as they were
    for series in ("6.18", "7.x"):
        tcg = harness.qemu_systemd_argv(k, i, tmp_path, accel="tcg", cpus=4, memory_mib=2048,
                                        series=series)  # fmt: skip
        assert tcg[tcg.index("-append") + 1].split()[-1] == "tsc=unstable"
        # and run their vCPUs on one host thread (no vCPU runs while another patches code)
        assert tcg[tcg.index("-accel") + 1] == "tcg,thread=single"
    others: tuple[tuple[str | None, str], ...] = (("5.10", "tcg"), (None, "tcg"), ("6.18", "kvm"))
    for other_series, accel in others:
        other = harness.qemu_systemd_argv(k, i, tmp_path, accel=accel, cpus=4, memory_mib=2048,
                                          series=other_series)  # fmt: skip
        assert "tsc=" not in other[other.index("-append") + 1]
        assert other[other.index("-accel") + 1] in ("tcg,thread=multi", "kvm")
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
    monkeypatch: pytest.MonkeyPatch,
    *,
    kernel_ok: bool = True,
    parallel: bool = True,
    hold: tuple[str, str] = ("kernel", "systemd"),
) -> list[tuple[str, str]]:
    """Tiers that record when they start and end. In parallel mode the fake tier hold[0]
    (the kernel guest) ends only once hold[1] (the systemd tier) has ended (an event, not a
    sleep: no timing involved); if the harness did not overlap them, it gives up after 30 s
    and the order shows it."""
    import threading

    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    other_done = threading.Event()

    def fake(tier: str, ok: bool = True) -> TierResult:
        with lock:
            events.append(("start", tier))
        if tier == hold[0] and parallel:
            other_done.wait(timeout=30)
        with lock:
            events.append(("end", tier))
        if tier == hold[1]:
            other_done.set()
        return TierResult(tier, ok=ok, wall=0.0, counts=Counts(tests=1))

    monkeypatch.delenv("GOVERNOR_TEST_STARTED", raising=False)
    monkeypatch.setattr(harness, "find_kernel", lambda: Path("/boot/vmlinuz-fake"))
    monkeypatch.setattr(harness, "series_kernel", lambda s: Path(f"/kernels/{s}/vmlinuz"))
    monkeypatch.setattr(harness, "detect_accel", lambda *_a: ("tcg", "requested"))
    monkeypatch.setattr(harness, "precompile", lambda **_k: None)
    monkeypatch.setattr(harness, "tier_lint", lambda _o: fake("lint"))
    monkeypatch.setattr(harness, "tier_host", lambda _o: fake("host"))

    def qemu(_o: object, tier: str, kernel: Path, *_a: object) -> TierResult:
        events.append(("kernel", str(kernel)))  # not a tier: the vmlinuz the tier boots
        return fake(tier, kernel_ok or tier != "kernel")

    monkeypatch.setattr(harness, "tier_qemu", qemu)
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


def test_overlap_runs_the_one_thread_guests_beside_the_kernel_guest_and_host_beside_systemd(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--overlap runs the compat tiers' guests, each on one host thread of TCG, beside the
    kernel guest, then lint and host, after it, beside the systemd guest: two threads, each
    one tier after the other."""
    import threading

    events = _fake_tiers(monkeypatch, hold=("systemd", "host"))
    # the fake systemd tier ends only once host has, and compat-5.10 starts only once the
    # kernel tier has: in series, one of them would wait 30 s and the order would show it
    started, linted = threading.Event(), threading.Event()
    qemu, lint = harness.tier_qemu, harness.tier_lint

    def guest(opts: harness.Options, tier: str, *a: Any) -> TierResult:
        if tier == "kernel":
            started.set()
            # a lint that did not wait for the kernel guest would start meanwhile; the
            # timeout only bounds how long this fake guest gives it
            linted.wait(timeout=2)
        elif tier == "compat-5.10":
            started.wait(timeout=30)
        return qemu(opts, tier, *a)

    def lint_now(opts: harness.Options) -> TierResult:
        linted.set()
        return lint(opts)

    monkeypatch.setattr(harness, "tier_qemu", guest)
    monkeypatch.setattr(harness, "tier_lint", lint_now)
    assert harness.main(["--overlap", "--results", str(tmp_path / "r")]) == 0
    order = [ev for ev in events if ev[0] != "kernel"]
    at = order.index
    # compat-5.10 started once the kernel tier had, and ended before it: beside it
    assert at(("end", "compat-5.10")) < at(("end", "kernel"))
    assert at(("end", "kernel")) < at(("start", "lint"))  # lint and host after it
    assert at(("start", "systemd")) < at(("end", "host"))  # beside the systemd guest
    behind = [ev for ev in order if ev[1] in ("compat-5.10", "compat-6.18", "lint", "host")]
    assert behind == [(e, t) for t in ("compat-5.10", "compat-6.18", "lint", "host")
                      for e in ("start", "end")]  # fmt: skip
    ahead = [ev for ev in order if ev[1] in ("kernel", "systemd")]
    assert ahead == [(e, t) for t in ("kernel", "systemd") for e in ("start", "end")]
    assert harness.overlap_tiers(harness.DEFAULT_TIERS, "tcg") == [
        "compat-5.10", "compat-6.18", "lint", "host"
    ]  # fmt: skip
    assert harness.overlap_tiers(harness.DEFAULT_TIERS, "kvm") == []
    assert harness.overlap_tiers(["kernel", "compat-6.18"], "tcg") == ["compat-6.18"]
    # no multi-threaded guest: the compat guests beside lint and host, as before
    assert harness.overlap_tiers(["lint", "host", "compat-5.10"], "tcg") == ["compat-5.10"]
    assert harness.overlap_tiers(["compat-5.10"], "tcg") == []
    # their qemu: one host thread under --overlap, the series' own threading without it
    over = harness.parse_args(["--overlap", "--results", str(tmp_path / "o")])
    assert over.overlap and harness.tier_thread(over, "compat-5.10") == "single"
    assert harness.tier_thread(over, "kernel") is None
    plain = harness.parse_args(["--results", str(tmp_path / "p")])
    assert not plain.overlap and harness.tier_thread(plain, "compat-5.10") is None
    if shutil.which("qemu-system-x86_64") is not None:
        argv = harness.qemu_systemd_argv(Path("/k"), Path("/i"), tmp_path, accel="tcg", cpus=4,
                                         memory_mib=2048, series="5.10", thread="single")  # fmt: skip
        assert argv[argv.index("-accel") + 1] == "tcg,thread=single"


def test_serial_runs_one_tier_at_a_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    events = _fake_tiers(monkeypatch, parallel=False)
    assert harness.main(["--results", str(tmp_path / "r")]) == 0
    booted = [k for e, k in events if e == "kernel"]
    assert booted == ["/boot/vmlinuz-fake"] * 2 + ["/kernels/5.10/vmlinuz", "/kernels/6.18/vmlinuz"]
    tiers = ("lint", "host", "kernel", "systemd", "compat-5.10", "compat-6.18")
    assert [ev for ev in events if ev[0] != "kernel"] == [
        (e, t) for t in tiers for e in ("start", "end")
    ]
    # --kernel: the kernel and systemd tiers boot that series
    events.clear()
    assert harness.main(["--kernel", "5.10", "--results", str(tmp_path / "r2")]) == 0
    assert [k for e, k in events if e == "kernel"] == ["/kernels/5.10/vmlinuz"] * 2


# ------------------------------------------------------------------ skips, deadline, durations

CASES = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="host" errors="1" failures="1" skipped="2" tests="6" time="9.0">
<testcase classname="tests.unit.test_a" name="test_ok" time="1.5"/>
<testcase classname="tests.unit.test_a" name="test_bad" time="0.2"><failure message="x"/></testcase>
<testcase classname="tests.unit.test_a" name="test_err" time="0.1"><error message="y"/></testcase>
<testcase classname="tests.unit.test_b" name="test_sk[1]" time="0.0">
<skipped type="pytest.skip" message="needs a hybrid host">tests/unit/test_b.py:3: needs</skipped>
</testcase>
<testcase classname="tests.unit.test_b" name="test_xf" time="0.3">
<skipped type="pytest.xfail" message="known bug"/></testcase>
<testcase time="4.0"/>
</testsuite></testsuites>"""


def _junit(tmp_path: Path, text: str = CASES) -> Path:
    f = tmp_path / "junit.xml"
    f.write_text(text)
    return f


def test_parse_cases_reads_outcomes_times_and_skip_reasons(tmp_path: Path) -> None:
    cases = parse_cases(_junit(tmp_path))
    assert [(c.id, c.outcome, c.reason) for c in cases] == [
        ("tests.unit.test_a::test_ok", "passed", ""),
        ("tests.unit.test_a::test_bad", "failed", ""),
        ("tests.unit.test_a::test_err", "error", ""),
        ("tests.unit.test_b::test_sk[1]", "skipped", "needs a hybrid host"),
        ("tests.unit.test_b::test_xf", "xfail", "known bug"),
        ("(interrupted test)", "passed", ""),
    ]
    assert [c.time for c in cases] == [1.5, 0.2, 0.1, 0.0, 0.3, 4.0]


SKIPPED_ONLY = """<testsuites><testsuite name="host" tests="3" failures="0" errors="0"
skipped="1"><testcase classname="m" name="test_ok" time="1"/>
<testcase classname="m" name="test_two" time="1"/>
<testcase classname="m" name="test_sk" time="0">
<skipped type="pytest.skip" message="systemd-analyze not installed"/></testcase>
</testsuite></testsuites>"""


def test_a_skip_not_on_the_allow_list_fails_the_tier_only_in_ci(tmp_path: Path) -> None:
    f = _junit(tmp_path, SKIPPED_ONLY)
    dev = judge_pytest("host", 0, f, 1.0, ci=False, allowed=())
    assert dev.ok, "a developer's run reports the skip but passes"
    assert any("would fail it under CI=true" in n for n in dev.notes)
    ci = judge_pytest("host", 0, f, 1.0, ci=True, allowed=())
    assert not ci.ok
    assert any("m::test_sk: systemd-analyze not installed" in n for n in ci.notes)
    entry = skips.Allowed("host", r"^systemd-analyze not installed", "why")
    assert judge_pytest("host", 0, f, 1.0, ci=True, allowed=(entry,)).ok
    other_tier = skips.Allowed("kernel", r"systemd-analyze", "why")
    assert not judge_pytest("host", 0, f, 1.0, ci=True, allowed=(other_tier,)).ok
    anywhere = skips.Allowed("*", r"systemd-analyze", "why")
    assert judge_pytest("host", 0, f, 1.0, ci=True, allowed=(anywhere,)).ok


def test_an_xfail_is_judged_like_a_skip(tmp_path: Path) -> None:
    text = SKIPPED_ONLY.replace('type="pytest.skip"', 'type="pytest.xfail"')
    res = judge_pytest("host", 0, _junit(tmp_path, text), 1.0, ci=True, allowed=())
    assert not res.ok
    assert any("xfail m::test_sk" in n for n in res.notes)


def test_the_allow_list_says_why_for_every_entry() -> None:
    for e in skips.ALLOWED:
        assert e.tier in (*harness.TIERS, "*"), e
        assert len(e.why) > 20, f"say why {e.reason!r} is legitimate in CI"
        re.compile(e.reason)
    assert skips.is_ci({"CI": "true"}) and skips.is_ci({"CI": "1"})
    assert not skips.is_ci({}) and not skips.is_ci({"CI": "false"})


def test_the_duration_report_lists_the_slowest_15_per_tier() -> None:
    cases = [Case(f"m::test_{i:02d}", float(i), "passed") for i in range(20)]
    cases[19] = Case("m::test_19", 19.0, "failed")
    lint = [Case("ruff check", 1.0), Case("mypy", 30.0)]
    results = [
        TierResult("lint", True, 31.0, cases=lint),
        TierResult("host", False, 200.0, cases=cases),
        TierResult("kernel", False, 0.0, notes=["not started"]),
    ]
    out = format_durations(results, 300.0, phases=[("setup (scripts/setup)", 12.5)], budget=4800)
    lines = out.splitlines()
    assert lines[1].split() == ["setup", "(scripts/setup)", "12.5"]
    assert [ln.split()[:3] for ln in lines[2:5]] == [
        ["tier", "lint", "31.0"], ["tier", "host", "200.0"], ["tier", "kernel", "0.0"],
    ]  # fmt: skip
    assert lines[5].split()[:2] == ["total", "300.0"] and "budget 4800s" in lines[5]
    host = lines[lines.index("slowest 15 of 20 in tier host:") + 1 :]
    listed = [ln.split()[1] for ln in host[:15]]
    assert listed == [f"m::test_{i:02d}" for i in range(19, 4, -1)]
    assert host[0].endswith("[failed]")
    assert "m::test_04" not in out
    assert "slowest 2 of 2 in tier lint:" in out
    assert out.index("mypy") < out.index("ruff check")


def test_start_or_skip_cuts_the_timeout_and_refuses_a_late_tier(tmp_path: Path) -> None:
    opts = harness.parse_args(["--results", str(tmp_path)])
    now = time.monotonic()
    t, res = harness.start_or_skip("kernel", opts, harness.Clock(now + 10_000, 4800))
    assert res is None and t == harness.TIER_TIMEOUTS["kernel"]
    t, res = harness.start_or_skip("kernel", opts, harness.Clock(now + 1000, 4800))
    assert res is None and 0 < t <= 1000
    t, res = harness.start_or_skip("kernel", opts, harness.Clock(now + 100, 4800))
    assert res is not None and not res.ok and "not started" in res.notes[0]


def test_setup_seconds_from_the_start_stamp() -> None:
    assert harness.setup_seconds({"GOVERNOR_TEST_STARTED": "1000"}, now=1042.0) == 42.0
    assert harness.setup_seconds({}, now=5.0) == 0.0
    assert harness.setup_seconds({"GOVERNOR_TEST_STARTED": "x"}, now=5.0) == 0.0
    assert harness.setup_seconds({"GOVERNOR_TEST_STARTED": "99"}, now=5.0) == 0.0


def test_the_deadline_stops_a_running_tier_skips_the_rest_and_the_summary_prints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fake host tier that would run for 10 minutes: the overall deadline stops it; the
    guest tiers after it are not started; the summary and the duration report still print
    and the run fails."""
    _fake_tiers(monkeypatch, parallel=False)
    monkeypatch.delenv("GOVERNOR_TEST_STARTED", raising=False)
    monkeypatch.setattr(harness, "MIN_START_S", dict.fromkeys(harness.TIERS, 1.0))
    monkeypatch.setattr(harness, "INTERRUPT_GRACE_S", 5.0)
    seen: dict[str, object] = {}

    def hanging_host(opts: harness.Options) -> TierResult:
        seen["timeout"] = opts.timeout
        r = harness.run_streamed([sys.executable, "-c", "import time; time.sleep(600)"],
                                 tmp_path / "host.log", timeout=opts.timeout)  # fmt: skip
        seen["rc"] = r.rc
        return judge_pytest("host", r.rc, tmp_path / "none.xml", r.wall)

    monkeypatch.setattr(harness, "tier_host", hanging_host)
    rc = harness.main(["--deadline", "3", "--results", str(tmp_path / "r")])
    assert rc == 1
    assert seen["rc"] is None, "the hanging tier was stopped, not waited for"
    assert isinstance(seen["timeout"], float) and seen["timeout"] <= 3
    out = capsys.readouterr().out
    table = out[out.index("\ntier ") + 1 :]
    assert [ln.split()[:2] for ln in table.splitlines()[2:6]] == [
        ["lint", "ok"], ["host", "FAIL"], ["kernel", "FAIL"], ["systemd", "FAIL"],
    ]  # fmt: skip
    assert "kernel: not started:" in table and "systemd: not started:" in table
    assert "cut the tier's timeout" in table
    assert "durations (wall seconds)" in out
    assert (tmp_path / "r" / "durations.txt").read_text().startswith("durations")
    assert "FAIL" in (tmp_path / "r" / "summary.txt").read_text()


def test_an_interrupted_pytest_leaves_its_junit_xml(tmp_path: Path) -> None:
    """What a tier's time limit does to pytest (SIGINT first): it stops and writes the junit
    xml of what ran, so the report still shows the tier's tests. Synchronised on a file the
    slow test writes when it starts, not on time."""
    started = tmp_path / "started"
    (tmp_path / "test_slow.py").write_text(
        "import pathlib, time\n"
        "def test_fast() -> None:\n    pass\n"
        f"def test_slow() -> None:\n    pathlib.Path({str(started)!r}).touch()\n"
        "    time.sleep(600)\n"
    )
    junit = tmp_path / "j.xml"
    # SIGINT at its default even when this runs in a shell's background (ignored there, and
    # inherited): harness.restore_sigint does the same for the tiers
    default_int = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);"
        " os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", default_int, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "no:randomly", f"--junitxml={junit}", "--rootdir", str(tmp_path),
         str(tmp_path / "test_slow.py")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        cwd=tmp_path,
    )  # fmt: skip
    try:
        for _ in range(1200):
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert started.exists(), "the slow test never started"
    finally:
        harness._kill_group(proc, grace=120.0)  # a loaded machine: pytest may take long to write it
    cases = parse_cases(junit)
    assert ("test_slow::test_fast", "passed") in [(c.id, c.outcome) for c in cases]


def test_the_harness_takes_sigint_back_when_it_was_started_with_it_ignored() -> None:
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        harness.restore_sigint()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        handler = signal.getsignal(signal.SIGINT)
        harness.restore_sigint()  # a handler already there stays
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_guest_script_stops_pytest_before_the_host_kills_the_guest() -> None:
    s = harness.guest_script("kernel", "/res", [], environ={}, budget=600)
    assert "timeout --signal=INT --kill-after=30 600 " in s
    assert "timeout --signal" not in harness.guest_script("kernel", "/res", [], environ={})
    subprocess.run(["bash", "-n", "-c", s], check=True)


def test_full_selects_the_full_tests_with_larger_limits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GOVERNOR_TEST_FULL", raising=False)
    monkeypatch.delenv("GOVERNOR_VM_TIMEOUT", raising=False)
    monkeypatch.delenv("GOVERNOR_TEST_DEADLINE", raising=False)
    default = harness.parse_args([])
    full = harness.parse_args(["--full"])
    assert not default.full and full.full
    assert default.deadline == harness.DEADLINE_S < 90 * 60
    assert full.deadline == harness.FULL_DEADLINE_S
    assert full.timeouts["kernel"] > default.timeouts["kernel"]
    assert full.memory_mib == harness.FULL_GUEST_MEMORY_MIB
    argv = harness.guest_pytest_argv("kernel", "/r", [])
    assert argv[argv.index("-m", argv.index("pytest")) + 1] == "kernel and not full"
    assert f"--timeout={harness.GUEST_TEST_TIMEOUT_S}" in argv
    # a temporary base of its own per run, never /tmp/pytest-of-<user> (which the host's
    # pytest beside it shares through the overlay)
    bases = [a for a in argv if a.startswith("--basetemp=/tmp/pytest-guest-kernel-")]
    assert "governor" not in bases[0]  # tests find the governor's processes by that word
    again = [a for a in harness.guest_pytest_argv("kernel", "/r", []) if a.startswith("--base")]
    assert len(bases) == 1 and again and again != bases
    fargv = harness.guest_pytest_argv("kernel", "/r", [], full=True)
    assert fargv[fargv.index("-m", fargv.index("pytest")) + 1] == "kernel"
    assert f"--timeout={harness.FULL_GUEST_TEST_TIMEOUT_S}" in fargv
    env = {"GOVERNOR_TEST_FULL": "1"}
    assert "GOVERNOR_TEST_FULL" not in harness.guest_script("kernel", "/r", [], environ=env)
    assert "export GOVERNOR_TEST_FULL=1\n" in harness.guest_script(
        "kernel", "/r", [], environ={}, full=True
    )
    assert harness.parse_args(["--timeout", "77"]).timeouts == dict.fromkeys(harness.TIERS, 77)
    monkeypatch.setenv("GOVERNOR_TEST_FULL", "1")
    assert harness.parse_args([]).full


def test_per_tier_limits_stay_inside_the_deadline_and_per_test_limits_inside_the_tier() -> None:
    for table in (harness.TIER_TIMEOUTS, harness.FULL_TIER_TIMEOUTS):
        assert set(table) == set(harness.TIERS)
    assert max(harness.TIER_TIMEOUTS.values()) < harness.DEADLINE_S
    # "well below": a test may take at most two thirds of its tier's pytest time
    for tier in harness.GUEST_TIERS:
        guest_pytest = harness.TIER_TIMEOUTS[tier] - harness.GUEST_OVERHEAD_S
        assert guest_pytest * 2 / 3 >= harness.GUEST_TEST_TIMEOUT_S
        full_pytest = harness.FULL_TIER_TIMEOUTS[tier] - harness.GUEST_OVERHEAD_S
        assert full_pytest * 2 / 3 >= harness.FULL_GUEST_TEST_TIMEOUT_S
    assert harness.TIER_TIMEOUTS["host"] * 2 / 3 >= harness.HOST_TEST_TIMEOUT_S
    # a budget fires before the tier's timeout cuts it: growth is seen while every test runs
    assert set(harness.TIER_BUDGETS) == set(harness.TIERS)
    for tier, budget in harness.TIER_BUDGETS.items():
        assert 0 < budget < harness.TIER_TIMEOUTS[tier], tier


def test_default_runs_deselect_full_tests_so_they_are_not_skips(tmp_path: Path) -> None:
    """The marker expression of a default run leaves the `full` tests out of the junit xml
    altogether (not counted as skipped); --full's expression runs them."""
    (tmp_path / "test_m.py").write_text(
        "import pytest\n"
        "@pytest.mark.kernel\ndef test_small() -> None:\n    pass\n"
        "@pytest.mark.kernel\n@pytest.mark.full\ndef test_big() -> None:\n    pass\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    kernel: k\n    full: f\n")
    for full, want in ((False, ["test_small"]), (True, ["test_small", "test_big"])):
        junit = tmp_path / f"j{full}.xml"
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers",
             "-m", harness.markexpr("kernel", full), f"--junitxml={junit}", "test_m.py"],
            cwd=tmp_path, check=True, capture_output=True,
        )  # fmt: skip
        assert [c.id.split("::")[1] for c in parse_cases(junit)] == want
        assert parse_junit(junit).skipped == 0


def test_arm64_guest_selects_the_compat_marker_once_registered(tmp_path: Path) -> None:
    from vm import arm64

    py = tmp_path / "pyproject.toml"
    py.write_text('markers = [\n    "kernel: real kernel",\n]\n')
    assert arm64.compat_selection(py) == arm64.COMPAT_K
    assert arm64.TINY_TEST in arm64.COMPAT_K
    py.write_text('markers = [\n    "kernel: real kernel",\n    "compat: the subset",\n]\n')
    assert arm64.compat_selection(py) == f"compat or {arm64.TINY_TEST}"


def test_arm64_guest_script_runs_the_trees_python_with_the_wheels(tmp_path: Path) -> None:
    from vm import arm64

    text = arm64.guest_script("/run/vmshare", [], budget=600)
    assert "python3 -m pytest" in text and ".venv" not in text
    assert f"PYTHONPATH={harness.ROOT}:{arm64.SITE}" in text
    assert "--ignore=tests/kernel/test_server_guest.py" in text and " -k " in text
    assert "GOVERNOR_ENGINE_CACHE" not in text


def test_arm64_boots_618_for_the_compat_set_without_the_engine(tmp_path: Path) -> None:
    # issue 47: 6.18 arm64 through --arch arm64 (its own kernel and rootfs); the tiny model's
    # arm64 llama.cpp does not depend on the kernel and stays with 6.1's run
    from vm import arm64

    o = harness.parse_args(["--arch", "arm64", "--kernel", "6.18"])
    assert (o.tiers, o.kernel_series, o.arch) == (["kernel"], "6.18", "arm64")
    with pytest.raises(SystemExit):
        harness.parse_args(["--arch", "arm64", "--kernel", "7.x"])
    k = arm64.kernel_for("6.18")
    assert (k.dir.name, k.rootfs.name, k.engine) == ("kernel-6.18", "rootfs-for-6.18", False)
    assert arm64.kernel_for(None) == arm64.kernel_for("6.1")
    assert arm64.kernel_for(None).engine and arm64.kernel_for(None).dir.name == "kernel"
    py = tmp_path / "pyproject.toml"
    py.write_text('markers = [\n    "compat: the subset",\n]\n')
    assert arm64.compat_selection(py, tiny=False) == "compat"
    py.write_text('markers = [\n    "kernel: real kernel",\n]\n')
    assert arm64.TINY_TEST not in arm64.compat_selection(py, tiny=False)
    text = arm64.guest_script("/run/vmshare", [], budget=600, tiny=False)
    assert arm64.TINY_TEST not in text
