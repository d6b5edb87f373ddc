"""Real page cache in the guests (an ext4 loop mount): perf/_helpers/disk.py, which perf/qos.py
also uses (perf/ does not import from tests/)."""

from __future__ import annotations

from perf._helpers.disk import DISK_FS, MIB, loop_mount, make_file, writable_disk_dir

__all__ = ["DISK_FS", "MIB", "loop_mount", "make_file", "writable_disk_dir"]
