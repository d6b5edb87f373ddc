"""The one door to /proc (proc(5)), root injected like CgroupFs's: tests pass a tmp tree.

Readers return text or parsed values through governor/kernel/parse.py; they raise OSError
(callers decide whether a missing file matters) except where a default is documented.
"""

from __future__ import annotations

import os
from pathlib import Path

from governor.kernel.parse import parse_flat_keyed, parse_meminfo, parse_stat_starttime


class ProcFs:
    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"ProcFs({str(self.root)!r})"

    def path(self, *parts: str | int) -> Path:
        return self.root.joinpath(*(str(p) for p in parts))

    def read(self, *parts: str | int) -> str:
        return self.path(*parts).read_text()

    def pid1_comm(self) -> str:
        """PID 1's command name; "" when it cannot be read (hidepid=)."""
        try:
            return self.read(1, "comm").strip()
        except OSError:
            return ""

    def self_cgroup(self) -> str:
        """/proc/self/cgroup as text (the cgroup2 line is "0::/path")."""
        return self.read("self", "cgroup")

    def meminfo(self) -> dict[str, int]:
        """/proc/meminfo in bytes."""
        return parse_meminfo(self.read("meminfo"))

    def vmstat(self) -> dict[str, int]:
        """/proc/vmstat: event counters and page counts (pages, not bytes)."""
        return parse_flat_keyed(self.read("vmstat"))

    def pressure(self, resource: str) -> str:
        """/proc/pressure/<resource> as text."""
        return self.read("pressure", resource)

    def cpuinfo(self) -> str:
        """/proc/cpuinfo; "" when unreadable (some containers hide it)."""
        try:
            return self.read("cpuinfo")
        except OSError:
            return ""

    def write_oom_score_adj(self, value: int, pid: int | str = "self") -> None:
        fd = os.open(self.path(pid, "oom_score_adj"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(value).encode())
        finally:
            os.close(fd)

    def starttime(self, pid: int | str = "self") -> int:
        """/proc/<pid>/stat's starttime (clock ticks after boot): OSError when the pid is
        gone, ValueError when the file is not a stat."""
        return parse_stat_starttime(self.read(pid, "stat"))

    def status(self, pid: int | str = "self") -> dict[str, str]:
        """/proc/<pid>/status as key -> value text."""
        out = {}
        for line in self.read(pid, "status").splitlines():
            key, _, value = line.partition(":")
            out[key] = value.strip()
        return out
