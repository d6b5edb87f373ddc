"""[clocks] at run time: set the board's clocks with the slice, verify each write by reading it
back, restore the originals exactly when the last holder lets go.

tuned's sysfs plugin is the model (save the original, write, verify, write the original
back), with one addition a board needs: the clocks are board-wide, so the ledger
(governor/rundir/clocks.py) records who holds each device. The rule, stated once:

- a device nobody holds is set and its originals saved;
- a device held with exactly the same writes is shared: the new holder joins, nothing is
  written, and the originals are restored only when the last holder lets go;
- a device held with other writes is refused (PolicyError, 65, naming the holder policy)
  before anything of this policy's clocks is written: never last-writer-wins.

A write the kernel refuses, or that does not read back as written, is an error (71); what this
acquisition wrote is restored first, so nothing is left half-applied. Holders whose governor is
gone (a crash that also took the watchdog) are pruned, and their devices restored, by the next
acquisition. ``python -m governor.backends.clocks RUN_DIR POLICY PID`` is the watchdog's
restore after the governor died (governor/supervise/watchdog.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from governor.errors import BackendError, GovernorError, PolicyError
from governor.kernel import clocks as kc
from governor.log import get_logger
from governor.plan.model import ClockTarget, ClockWrite, Plan
from governor.rundir.clocks import ClockEntry, Holder, Ledger, within
from governor.rundir.liveness import alive as governor_alive

log = get_logger("governor.clocks")

ANY_PID = -1  # release(): every holder of the policy (`governor remove`)
UNSUPPORTED = "<unsupported>"  # scaling_setspeed outside the userspace governor: no value


def request(target: ClockTarget) -> list[list[str]]:
    return [[w.file, w.value] for w in target.writes]


def spelled(req: list[list[str]]) -> str:
    return ", ".join(f"{f}={v}" for f, v in req)


def same(read_back: str, value: str) -> bool:
    if read_back.isdigit() and value.isdigit():
        return int(read_back) == int(value)
    return read_back == value


def ordered(target: ClockTarget, current_min: int | None) -> list[ClockWrite]:
    """The writes in an order the kernel accepts: a new max below the current min goes after
    the new min, else before it (either way every intermediate min <= max)."""
    files = kc.ROLE_FILES[target.kind]  # type: ignore[index]  # cpufreq | devfreq, compiled
    writes = list(target.writes)
    by_file = {w.file: w for w in writes}
    lo, hi = by_file.get(files["min"]), by_file.get(files["max"])
    if lo is None or hi is None:
        return writes
    rest = [w for w in writes if w not in (lo, hi)]
    first = [lo, hi] if current_min is not None and int(hi.value) < current_min else [hi, lo]
    governor = [w for w in rest if w.file == files["governor"]]
    return [*governor, *first, *(w for w in rest if w.file != files["governor"])]


class BoardClocks:
    """The run time's door to [clocks]: acquire with the slice, release at the end."""

    def __init__(
        self,
        directory: Path,
        *,
        sysfs_root: str | Path,
        alive: Callable[[int], bool] | None = None,
    ) -> None:
        # every device and file written, the ledger's included, resolves under sysfs_root
        self.ledger = Ledger(directory, sysfs_root)
        self.sysfs_root = str(sysfs_root)
        self.alive = alive or governor_alive

    def _write(self, path: str, value: str) -> None:
        """kc.write, only under the sysfs root (a ledger's entry, a symlink put in since)."""
        if not within(path, self.sysfs_root):
            raise BackendError(
                f"clock file {path} is outside the sysfs root {self.sysfs_root}",
                file=path,
                value=value,
                hint=f"the clock ledger {self.ledger.path} was changed by hand or forged:"
                " repair it",
            )
        kc.write(path, value)

    # ------------------------------------------------------------------ acquire

    def acquire(self, plan: Plan, *, pid: int | None, source: str) -> list[str]:
        """Set (or share) every clock of ``plan``; the devices written, by path."""
        if not plan.clocks:
            return []
        holder = Holder(plan.policy, pid, source)
        with self.ledger.locked() as entries:
            self._prune(entries)
            for t in plan.clocks:
                if t.path in self.ledger.invalid:
                    raise BackendError(
                        f"{t.kind} {t.name} has an entry the governor cannot read:"
                        f" {next(p for p in self.ledger.problems if repr(t.path) in p)}",
                        file=str(self.ledger.path),
                        hint="restore the device's clocks by hand (or reboot), then remove"
                        " its entry from the clock ledger",
                    )
                held = entries.get(t.path)
                if held is None:
                    continue
                if held.failed:
                    raise BackendError(
                        f"{t.kind} {t.name} was not restored after its last holder:"
                        f" {held.failed[0]}",
                        file=t.path,
                        hint="restore it by hand (or reboot), then remove its entry from the"
                        f" clock ledger {self.ledger.path}",
                    )
                if held.request != request(t):
                    raise PolicyError(
                        f"{t.kind} {t.name} is held by policy {held.holder_names()} with"
                        f" {spelled(held.request)}; this policy asks for"
                        f" {spelled(request(t))}",
                        file=plan.source,
                        field=f"clocks.{t.key}",
                        hint="board clocks are shared only by policies asking for the same"
                        " settings: stop the holder, or give both the same [clocks] entry",
                    )
            written: list[str] = []
            joined: list[str] = []  # the devices this acquisition added the holder to
            try:
                for t in plan.clocks:
                    held = entries.get(t.path)
                    if held is not None:
                        if holder not in held.holders:
                            held.holders.append(holder)
                            joined.append(t.path)
                        log.info("clocks.shared", device=t.name, holders=held.holder_names())
                        continue
                    entry = entries[t.path] = ClockEntry(
                        key=t.key, kind=t.kind, name=t.name, path=t.path, request=request(t),
                        holders=[holder],
                    )  # fmt: skip
                    written.append(t.path)
                    self._set(t, entry.saved)
                    log.info("clocks.set", device=t.name, request=spelled(entry.request))
            except BaseException:
                for path in reversed(written):
                    self._restore_entry(entries, path)
                # only the holds this acquisition added: a re-apply's earlier hold stays
                for path in joined:
                    held = entries.get(path)
                    if held is not None and holder in held.holders:
                        held.holders.remove(holder)
                raise
        return written

    def _set(self, target: ClockTarget, saved: list[list[str]]) -> None:
        files = kc.ROLE_FILES[target.kind]  # type: ignore[index]  # cpufreq | devfreq
        current_min = kc.read(os.path.join(target.path, files["min"]))
        for w in ordered(target, int(current_min) if current_min.isdigit() else None):
            path = os.path.join(target.path, w.file)
            before = kc.read(path)
            self._write(path, w.value)
            if before != UNSUPPORTED:
                saved.append([w.file, before])
            after = kc.read(path)
            if not same(after, w.value):
                raise BackendError(
                    f"clock write did not stick: {path} reads back {after!r} ({w.reason})",
                    file=path,
                    value=w.value,
                    hint="another agent (a thermal limit, a vendor daemon, a governor that"
                    " overrides it) holds this clock; what was written has been restored",
                )

    # ------------------------------------------------------------------ release

    def release(self, policy: str, *, pid: int | None) -> list[str]:
        """Let go of ``policy``'s holds (``pid``: that run's; ANY_PID: all of them); devices
        whose last holder left are restored. BackendError when a restore failed (after every
        device was tried). Returns the devices restored."""
        restored: list[str] = []
        problems: list[str] = []
        with self.ledger.locked() as entries:
            for path, entry in list(entries.items()):
                holders = entry.holders
                keep = [h for h in holders if not (h.policy == policy and pid in (ANY_PID, h.pid))]
                if len(keep) == len(holders):
                    continue
                entry.holders = keep
                if keep:
                    log.info("clocks.still_held", device=entry.name, holders=entry.holder_names())
                    continue
                errors = self._restore_entry(entries, path)
                if errors:
                    # the holders stay with the failed restore: a second release (remove)
                    # retries it, and status shows whose clock it is
                    entry.holders = holders
                    problems.extend(errors)
                else:
                    restored.append(entry.name)
        if problems:
            raise BackendError(
                f"clock restore failed: {problems[0]}",
                file=str(self.ledger.path),
                hint="the entry stays in the ledger; `governor status` shows it",
            )
        return restored

    def _prune(self, entries: dict[str, ClockEntry]) -> None:
        """Holders whose governor is gone leave; a device left without holders is restored."""
        for path, entry in list(entries.items()):
            before = entry.holders
            entry.holders = [h for h in before if h.pid is None or self.alive(h.pid)]
            if not entry.holders:
                log.warning("clocks.stale", device=entry.name, gone=len(before))
                if self._restore_entry(entries, path):
                    entry.holders = before  # whose it was, for status and a retry

    def _restore_entry(self, entries: dict[str, ClockEntry], path: str) -> list[str]:
        """Write back the originals in reverse order; the entry goes when all came back."""
        entry = entries[path]
        errors: list[str] = []
        for file, value in reversed(entry.saved):
            where = os.path.join(path, file)
            try:
                self._write(where, value)
                after = kc.read(where)
            except GovernorError as err:
                errors.append(str(err))
                continue
            if not same(after, value):
                errors.append(f"{where} reads back {after!r}, not the original {value!r}")
        if errors:
            entry.failed = errors
            log.error("clocks.restore_failed", device=entry.name, errors=errors)
        else:
            del entries[path]
            log.info("clocks.restored", device=entry.name)
        return errors


def main(argv: list[str]) -> int:
    """The watchdog's restore: RUN_DIR POLICY PID SYSFS_ROOT (that governor died)."""
    run_dir, policy, pid, sysfs_root = argv
    try:
        BoardClocks(Path(run_dir), sysfs_root=sysfs_root).release(policy, pid=int(pid))
    except GovernorError as err:
        sys.stderr.write(f"governor: {err}\n")
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover - run by the watchdog (tests/runtime)
    sys.exit(main(sys.argv[1:]))
