"""`governor tune NAME KEY=VALUE --confirm DURATION`: a change that reverts by itself unless the
operator confirms it (`governor tune NAME --confirm`) in time.

The revert must not depend on the tune command staying in the foreground, nor on a supervisor
(slices made by `governor apply` have none), so each such tune starts one small detached
process, ``python -m governor.operate.confirm`` (standard library only; 13 MB resident while it
waits, measured on the CI machine), in its own session:

1. it is started *before* anything is written and waits on its stdin, so its pid goes into the
   tune's journal entry (``reverter_pid``) next to ``confirm_by`` (epoch seconds);
2. the tune then writes the entry's id on that pipe (or closes it without one when the tune
   failed or changed nothing: the reverter exits at once);
3. it sleeps until ``confirm_by``, then, holding the journal's lock, reverts the entry through
   the same path as `governor rollback` (tune.rollback: cgroupfs, or the systemd manager for
   changes made through it) unless a ``confirm`` entry or a rollback came first. The revert is
   a ``rollback`` entry with ``reason: "not confirmed"``.

Under systemd the reverter is moved into a scope of its own right after its start
(``governor-confirm-<name>-<pid>.scope``, recorded as ``reverter_unit``): a logout with
logind's ``KillUserProcesses=yes``, or the stop of the unit the tune ran from, does not take it
along. Elsewhere it lives in the caller's cgroup; if it dies anyway, `governor status` says the
tune will not revert.

`governor tune NAME --confirm` appends ``confirm`` (``confirms: [ids]``) under the same lock,
and stops the waiting reverters. A board that reboots loses /run and the runtime values with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from governor.deploy.tunedropin import restore_dropin
from governor.kernel.cgroupfs import CgroupFs
from governor.operate.tune import rollback
from governor.rundir.journal import Journal
from governor.rundir.liveness import REVERTER, alive


class Reverter:
    """The detached reverter of one tune, between its start and the tune's outcome."""

    def __init__(self, run_dir: Path, name: str, cgroup_root: str, deadline: float) -> None:
        package_parent = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_parent, env.get("PYTHONPATH", "")) if p
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "governor.operate.confirm", str(run_dir), name, cgroup_root,
             repr(deadline)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True, cwd="/", env=env,
        )  # fmt: skip
        self.pid = self.proc.pid
        self.unit = detach(self.pid, name)

    def _close(self, text: str) -> None:
        stdin: IO[bytes] | None = self.proc.stdin
        if stdin is None:
            return
        with contextlib.suppress(OSError):
            if text:
                stdin.write(text.encode())
            stdin.close()

    def go(self, entry_ids: list[int]) -> None:
        self._close(" ".join(map(str, entry_ids)) + "\n")

    def cancel(self) -> None:
        self._close("")


SCOPE_WAIT_S = 2.0  # how long the tune waits to see the reverter in its own scope


def detach(pid: int, name: str) -> str | None:
    """Under systemd, move the reverter into a scope of its own (the manager's
    StartTransientUnit with ``PIDs=``, through busctl, as `systemd-run --scope` does for a new
    process), so that neither a logout (logind's ``KillUserProcesses=yes`` stops the session's
    scope) nor the stop of the unit the tune ran from takes it along. Returns the scope's
    name; None without systemd, or when the manager did not take it (the reverter then stays
    where it is: status says so if it dies)."""

    busctl = shutil.which("busctl")
    if not os.path.isdir("/run/systemd/system") or busctl is None:
        return None
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in name)
    unit = f"governor-confirm-{safe}-{pid}.scope"
    try:
        subprocess.run(
            [busctl, "call", "--timeout=10", "org.freedesktop.systemd1",
             "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager",
             "StartTransientUnit", "ssa(sv)a(sa(sv))", unit, "fail", "3",
             "PIDs", "au", "1", str(pid),
             "CollectMode", "s", "inactive-or-failed",
             "Description", "s", f"governor: revert of a tune of {name} unless confirmed",
             "0"],
            check=True, capture_output=True, timeout=15,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    deadline = time.monotonic() + SCOPE_WAIT_S
    while time.monotonic() < deadline:
        try:
            if f"/{unit}" in Path(f"/proc/{pid}/cgroup").read_text():
                return unit
        except OSError:
            return None
        time.sleep(0.02)
    return None


def confirm(journal: Journal) -> list[dict[str, Any]]:
    """Keep every pending tune: a ``confirm`` entry, and the reverters stopped. Returns the
    entries confirmed ([] when none was pending)."""
    with journal.locked():
        pending = journal.pending()
        if not pending:
            return []
        journal.append("confirm", [], confirms=[e["id"] for e in pending])
    for e in pending:
        _stop(e.get("reverter_pid"))
    return pending


def _stop(pid: int | None) -> None:
    """SIGTERM a reverter, only if that pid is still ours (its cmdline names governor.operate.confirm)."""

    if pid and alive(pid, marker=REVERTER):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def revert_if_pending(
    journal: Journal, fs: CgroupFs, entry_ids: list[int]
) -> dict[str, Any] | None:
    """The reverter's work at the deadline: undo the entries unless confirmed or undone."""

    with journal.locked():
        waiting = [e["id"] for e in journal.pending() if e["id"] in entry_ids]
        if not waiting:
            return None
        return rollback(
            fs, journal, ids=waiting, reason="not confirmed", restore_file=restore_dropin
        )


def main(argv: list[str]) -> int:
    run_dir, name, cgroup_root, deadline = Path(argv[0]), argv[1], argv[2], float(argv[3])
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    words = sys.stdin.readline().split()
    if not words or not all(w.isdigit() for w in words):
        return 0  # the tune failed or changed nothing
    entry_ids = [int(w) for w in words]
    while (left := deadline - time.time()) > 0:
        time.sleep(min(left, 1.0))
    try:
        revert_if_pending(Journal(run_dir / name), CgroupFs(Path(cgroup_root)), entry_ids)
    except Exception as err:  # nobody reads this process's stderr: leave a trace in the journal
        Journal(run_dir / name).append("error", [], error=f"revert of {entry_ids}: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
