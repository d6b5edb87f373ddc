"""Small cgroup v2 helpers for the real-kernel test fixtures (raw file reads and writes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# the `spawn` fixture: spawn(argv, cgroup=None, **popen_kwargs) -> Popen[str]
Spawn = Callable[..., "subprocess.Popen[str]"]


@dataclass
class ScratchSlice:
    """A unique cgroup name under the root (the `scratch_slice` fixture); the directory exists
    only after create(), and everything below it is killed and removed at teardown."""

    root: Path
    name: str

    @property
    def path(self) -> Path:
        return self.root / self.name

    def create(self) -> Path:
        self.path.mkdir(exist_ok=True)
        return self.path

    def child(self, name: str, create: bool = True) -> Path:
        """A cgroup below the slice (created with its parents unless create=False)."""
        p = self.path / name
        if create:
            p.mkdir(parents=True, exist_ok=True)
        return p


def read(path: Path) -> str:
    return path.read_text().strip()


def write(path: Path, value: str | int) -> None:
    """One write(2) of `value` (cgroupfs wants each value in a single write)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def read_kv(path: Path) -> dict[str, int]:
    """'key value' lines (memory.events, cgroup.events, memory.stat, cpu.stat)."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        k, _, v = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[k] = int(v)
    return out


def psi_total(path: Path, kind: str = "some") -> int:
    """The total= (µs) of the `kind` line of a PSI file (/proc/pressure/*, *.pressure)."""
    for line in path.read_text().splitlines():
        words = line.split()
        if words and words[0] == kind:
            for w in words[1:]:
                if w.startswith("total="):
                    return int(w[6:])
    raise ValueError(f"no {kind} total in {path}")


def pids(cgroup: Path) -> list[int]:
    return [int(x) for x in (cgroup / "cgroup.procs").read_text().split()]


def populated(cgroup: Path) -> bool:
    return read_kv(cgroup / "cgroup.events").get("populated", 0) != 0


def wait_for(pred: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll pred() until it returns something truthy; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def start_in_cgroup(
    cgroup: Path, argv: Sequence[str], **popen_kwargs: Any
) -> subprocess.Popen[str]:
    """Start argv with the child already in `cgroup`: the forked child writes its own pid to
    cgroup.procs before exec (race-free: nothing of the program runs outside the cgroup)."""
    procs = str(cgroup / "cgroup.procs")

    def enter() -> None:
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")  # "0" = the writing process
        finally:
            os.close(fd)

    popen_kwargs.setdefault("text", True)
    # preexec_fn: only os.open/os.write/os.close run between fork and exec (no locks taken)
    return subprocess.Popen(list(argv), preexec_fn=enter, **popen_kwargs)  # noqa: PLW1509


def subtree_dirs(top: Path) -> list[Path]:
    """`top` and all cgroups below it, deepest first."""
    if not top.is_dir():
        return []
    found = [top]
    for dirpath, dirnames, _ in os.walk(top):
        found += [Path(dirpath) / d for d in dirnames]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def kill_and_remove(top: Path, timeout: float = 60.0) -> list[str]:
    """Kill everything in `top`'s subtree (cgroup.kill, else SIGKILL per pid), wait until it
    is unpopulated and rmdir bottom-up. Returns the problems (empty list: all gone)."""
    problems: list[str] = []
    dirs = subtree_dirs(top)
    if not dirs:
        return problems
    for d in dirs:  # cgroup.kill is recursive, but a leftover may sit at any level
        kill = d / "cgroup.kill"
        try:
            if kill.exists():
                write(kill, 1)
            else:
                for pid in pids(d):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        except FileNotFoundError:
            continue  # removed meanwhile (a governor's watchdog removes its own): nothing left
        except OSError as exc:
            problems.append(f"cannot kill {d}: {exc}")

    def empty() -> bool:
        try:
            return not populated(top)
        except FileNotFoundError:
            return True  # removed meanwhile (host tier 2026-12-06: a watchdog's removal raced this)

    try:
        wait_for(empty, timeout, f"{top} to become unpopulated")
    except (AssertionError, OSError) as exc:
        problems.append(str(exc))
    for d in dirs:
        for attempt in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:  # EBUSY while the last tasks finish exiting
                if attempt == 49:
                    problems.append(f"cannot rmdir {d}: {exc}")
                time.sleep(0.2)
    return problems


def set_subtree_control(cgroup: Path, controllers: Sequence[str], enable: bool) -> list[str]:
    """Write +c / -c for each controller into cgroup.subtree_control; returns the failures."""
    sign = "+" if enable else "-"
    failures: list[str] = []
    for c in controllers:
        try:
            write(cgroup / "cgroup.subtree_control", f"{sign}{c}")
        except OSError as exc:
            failures.append(f"{sign}{c}: {exc.strerror or exc}")
    return failures
