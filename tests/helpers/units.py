"""systemd helpers for the systemd tier."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from governor.deploy.install import manifest_path


def systemctl_show(unit: str, *props: str) -> dict[str, str]:
    """`systemctl show -p P1 -p P2 ... unit` as a dict."""
    argv = ["systemctl", "show", *(f"--property={p}" for p in props), unit]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def systemd_version() -> int:
    out = subprocess.run(
        ["systemctl", "--version"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    m = re.match(r"systemd (\d+)", out)
    if m is None:
        raise ValueError(f"cannot parse systemctl --version: {out[:80]!r}")
    return int(m.group(1))


def installed(policy: str) -> bool:
    """Whether `governor install` left policy NAME on this board (its manifest is what
    `governor uninstall` reads: without it uninstall does nothing and exits 66). A teardown
    calls `governor uninstall` only then: each call is a Python start, seconds under TCG."""
    return manifest_path(Path("/"), policy).exists()
