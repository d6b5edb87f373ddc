"""`governor tune --persist`: the values outlive the run. An installed policy (governor install)
gets a drop-in on its slice unit, so the manager keeps them across daemon-reload, restarts and
reboots; any other policy gets its file rewritten (comments and layout kept)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from governor.backends import manager
from governor.backends.systemd import daemon_reload
from governor.deploy import install as inst
from governor.deploy import tunedropin
from governor.deploy.dropin import UNIT_DIR
from governor.errors import HostError, PermissionDenied
from governor.operate import tune as t
from governor.operate.tune.route import Routed
from governor.plan import unitmap
from governor.rundir.state import RunState

Overrides = dict[tuple[str, str], object]


def _settings(overrides: Overrides, routed: Routed, version: int) -> dict[str, str]:
    """The slice unit's directives for the overrides (HostError: one systemd cannot say)."""
    settings: dict[str, str] = {}
    for section, field_ in overrides:
        file = t.TUNABLE[f"{section}.{field_}"][2]
        value = routed.values[file]
        m = manager.managed(file, value, version)
        if m is None or m.directive is None:
            raise HostError(
                f"cannot persist {section}.{field_} into a systemd drop-in: systemd"
                f" {version} has no directive for {file} = {value} (--persist)",
                hint="change the policy file and run `governor install` again",
            )
        settings[m.directive] = m.ini(value)
    return settings


def persist(st: RunState, name: str, overrides: Overrides, routed: Routed) -> dict[str, Any]:
    """Persist the overrides; returns {file, diff, installed} and either ``before`` (the policy
    file's text, for undo_file) or ``dropin`` ({path, before}, what rollback restores)."""
    running = st.running
    path = str(st.policy_path or running.source)
    installed = inst.manifest_path(Path("/"), name).exists()
    version = routed.version
    try:
        if not installed or version is None:
            with open(path) as f:  # as t.persist reads it
                before = f.read()
            diff = t.persist(path, overrides)
            return {"file": path, "diff": diff, "installed": installed, "before": before}
        unit = unitmap.policy_slice(routed.plan_slice, name)
        target = f"/{UNIT_DIR}/{unit}.d/{tunedropin.DROPIN_NAME}"
        saved = tunedropin.persist_dropin(target, "Slice", _settings(overrides, routed, version))
    except PermissionError as err:
        raise PermissionDenied(
            "cannot write the persisted value", file=path, errno=err.errno, hint="run as root"
        ) from err
    daemon_reload()
    return {
        "file": target,
        "diff": saved["diff"],
        "installed": True,
        "dropin": {"path": target, "before": saved["before"]},
    }


def undo_file(saved: dict[str, Any], before: str) -> None:
    """Put a rewritten policy file back (the tune that persisted into it failed)."""
    tunedropin.write_atomic(saved["file"], before, os.stat(saved["file"]).st_mode & 0o7777)
