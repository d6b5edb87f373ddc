"""CgroupFs: path rules, the write flags, error translation, parsed readers (on a tmp tree)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from governor.errors import BackendError, PermissionDenied
from governor.kernel import files
from governor.kernel.cgroupfs import CgroupFs, translate

from .fakekernel import FakeKernelCgroupFs


@pytest.mark.parametrize(
    "cgroup", ["/sys/fs/cgroup", "a/../b", "..", "a//b", "a/", "./a", "a/./b", "a\0b"]
)
def test_cgroup_paths_that_escape_or_are_unclean_are_rejected(tmp_path: Path, cgroup: str) -> None:
    with pytest.raises(ValueError):
        CgroupFs(tmp_path).path(cgroup)


@pytest.mark.parametrize("file", ["", "a/b", "..", ".", "../cgroup.procs"])
def test_file_names_with_a_slash_or_dots_are_rejected(tmp_path: Path, file: str) -> None:
    fs = CgroupFs(tmp_path)
    with pytest.raises(ValueError):
        fs.read("", file)
    with pytest.raises(ValueError):
        fs.write("", file, "1")


def test_paths_are_relative_to_the_injected_root(tmp_path: Path) -> None:
    fs = CgroupFs(tmp_path)
    assert fs.path("") == tmp_path
    assert fs.path("governor.slice/npu-chat") == tmp_path / "governor.slice" / "npu-chat"


def test_write_never_creates_a_file(tmp_path: Path) -> None:
    fs = CgroupFs(tmp_path)
    with pytest.raises(BackendError) as exc:
        fs.write("", files.MEMORY_HIGH, "max")
    assert not (tmp_path / files.MEMORY_HIGH).exists()
    err = exc.value
    assert (err.cgroup, err.file, err.value, err.errno) == (
        "",
        files.MEMORY_HIGH,
        "max",
        errno.ENOENT,
    )
    assert err.hint == "controller not enabled in parent's cgroup.subtree_control"
    assert isinstance(err.__cause__, FileNotFoundError)


def test_write_truncates_and_writes_the_whole_value(tmp_path: Path) -> None:
    (tmp_path / files.CPU_MAX).write_text("max 100000\n")
    fs = CgroupFs(tmp_path)
    fs.write("", files.CPU_MAX, "5")
    assert (tmp_path / files.CPU_MAX).read_text() == "5"
    assert fs.read("", files.CPU_MAX) == "5"


def test_mkdir_says_whether_it_created_and_rmdir_removes(tmp_path: Path) -> None:
    fs = CgroupFs(tmp_path)
    assert fs.mkdir("a") is True
    assert fs.mkdir("a") is False
    assert fs.mkdir("a/b") is True
    assert fs.children("") == ["a"]
    assert fs.children("a") == ["a/b"]
    fs.rmdir("a/b")
    assert not fs.exists("a/b")
    with pytest.raises(BackendError) as exc:
        fs.rmdir("a/b")
    assert exc.value.errno == errno.ENOENT


def test_mkdir_below_a_missing_parent_is_a_backend_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError) as exc:
        CgroupFs(tmp_path).mkdir("missing/child")
    assert (exc.value.cgroup, exc.value.errno) == ("missing/child", errno.ENOENT)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_eacces_and_eperm_become_permission_denied_exit_77(code: int) -> None:
    err = translate(
        OSError(code, os.strerror(code)), "cannot write", cgroup="g", file="pids.max", value="9"
    )
    assert isinstance(err, PermissionDenied)
    assert err.exit_code == 77
    assert (err.cgroup, err.file, err.value, err.errno) == ("g", "pids.max", "9", code)


@pytest.mark.parametrize(
    ("code", "file", "hint"),
    [
        (errno.EBUSY, files.CGROUP_SUBTREE_CONTROL, "no internal processes"),
        (errno.EINVAL, files.CPUSET_CPUS, "CPU not in parent's cpuset.cpus.effective"),
        (errno.ENOENT, files.MEMORY_HIGH, "controller not enabled in parent's"),
        (errno.ENOENT, files.CGROUP_KILL, "5.14"),
    ],
)
def test_kernel_errors_carry_a_hint(code: int, file: str, hint: str) -> None:
    err = translate(OSError(code, os.strerror(code)), "cannot write", cgroup="g", file=file)
    assert isinstance(err, BackendError)
    assert err.exit_code == 71
    assert err.hint is not None and hint in err.hint


def test_readers_parse_kernel_text(fake_fs: FakeKernelCgroupFs) -> None:
    fake_fs.enable("", ["memory", "cpu"])
    fake_fs.mkdir("g")
    fake_fs.add_process("g", 4242)
    assert fake_fs.procs("g") == [4242]
    assert fake_fs.events("g") == {"populated": 1, "frozen": 0}
    assert fake_fs.controllers("g") == {"cpu", "memory"}
    assert fake_fs.subtree_control("") == {"cpu", "memory"}
    assert fake_fs.memory_events("g")["oom_kill"] == 0
    assert fake_fs.memory_stat("g")["file"] == 0
    assert fake_fs.cpu_stat("g")["usage_usec"] == 0
    assert fake_fs.read_psi("g", "memory").some.total == 0


def test_unexpected_kernel_text_is_a_backend_error_with_the_file(tmp_path: Path) -> None:
    (tmp_path / files.CGROUP_EVENTS).write_text("populated yes\n")
    with pytest.raises(BackendError) as exc:
        CgroupFs(tmp_path).events("")
    assert exc.value.file == files.CGROUP_EVENTS


def test_enable_and_disable_write_plus_and_minus_in_one_write(tmp_path: Path) -> None:
    (tmp_path / files.CGROUP_SUBTREE_CONTROL).write_text("")
    fs = CgroupFs(tmp_path)
    fs.enable("", ["memory", "cpu"])
    assert (tmp_path / files.CGROUP_SUBTREE_CONTROL).read_text() == "+memory +cpu"
    fs.disable("", ["io"])
    assert (tmp_path / files.CGROUP_SUBTREE_CONTROL).read_text() == "-io"


def test_open_dir_gives_a_directory_fd(tmp_path: Path) -> None:
    fd = CgroupFs(tmp_path).open_dir("")
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path))
    finally:
        os.close(fd)


def test_fake_kernel_gives_new_children_the_parents_controller_files(
    fake_fs: FakeKernelCgroupFs,
) -> None:
    fake_fs.enable("", ["memory", "cpu"])
    fake_fs.mkdir("g")
    assert fake_fs.read("g", files.MEMORY_HIGH) == "max\n"
    assert fake_fs.read("g", files.CPU_MAX) == "max 100000\n"
    assert not (fake_fs.path("g") / files.PIDS_MAX).exists()
    fake_fs.add_process("g", 1)
    with pytest.raises(BackendError) as exc:
        fake_fs.enable("g", ["memory"])
    assert exc.value.errno == errno.EBUSY
