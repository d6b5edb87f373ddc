"""on_governor_exit = "kill": the engine must not run on unnoticed if the governor dies.

Two mechanisms, because each covers what the other cannot:
- the engine gets PR_SET_PDEATHSIG = SIGKILL (set in the child after dropping privileges), so
  it dies the moment the governor does — but that reaches only the engine, not its children;
- a watchdog process blocks on a pipe whose only writer is the governor. When the governor
  dies (even by SIGKILL) the kernel closes the pipe; the watchdog reads EOF, writes cgroup.kill
  on the group (the whole subtree, race-free against forks), waits for it to empty and removes
  the cgroups. A governor that exits normally disarms it. Where the kernel has no cgroup.kill
  (before 5.14: a board's 5.10) it freezes the group (nothing forks away), sends SIGKILL to every
  pid of every cgroup.procs below it until none is left (or WAIT_EMPTY_S passed), and thaws it.

The watchdog is a POSIX shell (``/bin/sh``: dash or busybox on a board), not a copy of the
governor's interpreter: a fork of Python holds 5+ MiB that drift apart from the parent's as
both run, the shell about 0.3 MiB of PSS. It is spawned (posix_spawn) before the governor imports
anything but ``os`` (governor/main.py), in its own session (a ^C at the terminal is for the
governor) and with every signal a terminal or a service manager sends ignored. The cgroups it
must remove reach it as lines on the pipe (:meth:`Watchdog.arm`): cgroup names come from a
validated policy (no newline can be in them) and are quoted by the shell's ``read -r``.

The supervisor's published state (/run/governor/<name>/state.json) is removed too, after the
kill, when it still names the dead supervisor's pid (so `status` does not list it as stale).

A monitor whose rules `shed` lower QoS classes keeps the watchdog told what it holds on other
slices (:meth:`Watchdog.arm_shed`): at EOF the watchdog thaws them and writes memory.high back
to their value first, whatever else it was armed for.

Left to the next apply/remove on this path: lowering the slices' memory.min/low (the backend
re-sums them from the children that are left). The policy's slice is removed when it is empty.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

SHELL = "/bin/sh"
DISARM = b"disarm\n"
WAIT_EMPTY_S = 5  # how long to wait for "populated 0" after cgroup.kill before removing

# Reads "root PATH", "thaw CGROUP", "kill CGROUP", "rmdir CGROUP", the clock lines ("clockpy",
# "clockpath", "clockdir", "clocksys", "clocks POLICY PID") and the shed lines ("shedroot PATH",
# "shed-reset" and "shed OP VALUE CGROUP" with OP thaw or high: they replace the list of shed
# reverts, issue 23) until "disarm" (exit) or EOF (act: revert the sheds, thaw, then kill and
# remove, then give the board's clocks back).
_SCRIPT = r"""
trap '' INT TERM HUP QUIT USR1 USR2 PIPE TSTP TTIN TTOU
root= kill= thaw= state= spid= clockpy= clockpath= clockdir= clocksys= clocks= shedroot= shed=
set --
while IFS= read -r line; do
    case $line in
        disarm) exit 0 ;;
        "root "*) root=${line#root } ;;
        "shedroot "*) shedroot=${line#shedroot } ;;
        shed-reset) shed= ;;
        "shed "*) shed="$shed${line#shed }
" ;;
        "thaw "*) thaw=${line#thaw } ;;
        "kill "*) kill=${line#kill } ;;
        "state "*) spid=${line#state }; spid=${spid%% *}; state=${line#state $spid } ;;
        "rmdir "*) set -- "$@" "${line#rmdir }" ;;
        "clockpy "*) clockpy=${line#clockpy } ;;
        "clockpath "*) clockpath=${line#clockpath } ;;
        "clockdir "*) clockdir=${line#clockdir } ;;
        "clocksys "*) clocksys=${line#clocksys } ;;
        "clocks "*) clocks=${line#clocks } ;;
    esac
done
rc=0
if [ -n "$shedroot" ] && [ -n "$shed" ]; then
    printf '%s' "$shed" | while read -r op value cg; do
        case $op in
            thaw) file=cgroup.freeze value=0 ;;
            high) file=memory.high ;;
            *) continue ;;
        esac
        printf '{"event": "watchdog.governor_gone", "action": "unshed", "cgroup": "%s", "file": "%s", "value": "%s", "level": "warning"}\n' "$cg" "$file" "$value" >&2
        echo "$value" > "$shedroot/$cg/$file" 2>/dev/null
    done
fi
if [ -n "$root" ] && [ -n "$thaw" ] && [ -f "$root/$thaw/cgroup.freeze" ]; then
    printf '{"event": "watchdog.governor_gone", "action": "thaw", "cgroup": "%s", "level": "warning"}\n' "$thaw" >&2
    echo 0 > "$root/$thaw/cgroup.freeze" 2>/dev/null
fi
if [ -n "$root" ] && [ -n "$kill" ]; then
    group=$root/$kill
    if [ -e "$group/cgroup.kill" ] || [ ! -d "$group" ]; then
        printf '{"event": "watchdog.governor_gone", "action": "kill", "cgroup": "%s", "level": "warning"}\n' "$kill" >&2
        echo 1 > "$group/cgroup.kill" 2>/dev/null
    else
        # Linux < 5.14: freeze, SIGKILL each pid of the subtree until none is left, thaw
        printf '{"event": "watchdog.governor_gone", "action": "kill", "cgroup": "%s", "fallback": "sigkill", "level": "warning"}\n' "$kill" >&2
        [ -e "$group/cgroup.freeze" ] && echo 1 > "$group/cgroup.freeze" 2>/dev/null
        n=0
        while [ $n -lt $((WAIT_S * 50)) ]; do
            pids=$(find "$group" -name cgroup.procs -exec cat {} + 2>/dev/null)
            [ -n "$pids" ] || break
            kill -9 $pids 2>/dev/null
            sleep 0.02 2>/dev/null || sleep 1
            n=$((n + 1))
        done
        [ -e "$group/cgroup.freeze" ] && echo 0 > "$group/cgroup.freeze" 2>/dev/null
    fi
    # the published state of the supervisor that is gone (not one a new run wrote since)
    if [ -n "$state" ] && grep -q "\"pid\": $spid[,}]" "$state" 2>/dev/null; then
        rm -f "$state"
        rmdir "${state%/*}" 2>/dev/null
    fi
    n=0
    while [ $n -lt $((WAIT_S * 50)) ] && ! grep -q '^populated 0' "$root/$kill/cgroup.events" 2>/dev/null; do
        sleep 0.02 2>/dev/null || sleep 1
        n=$((n + 1))
    done
    for dir in "$@"; do
        [ -d "$root/$dir" ] || continue
        rmdir "$root/$dir" 2>/dev/null || rc=1
    done
fi
if [ -n "$clocks" ] && [ -n "$clockpy" ]; then
    printf '{"event": "watchdog.governor_gone", "action": "restore clocks", "holder": "%s", "level": "warning"}\n' "$clocks" >&2
    PYTHONPATH="$clockpath${PYTHONPATH:+:$PYTHONPATH}" "$clockpy" -m governor.backends.clocks \
        "$clockdir" ${clocks% *} ${clocks#* } "$clocksys" || rc=1
fi
exit $rc
"""


class Watchdog:
    """The governor's end of the pipe."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd: int | None = fd

    def arm(
        self, cgroup_root: str, kill: str, remove: tuple[str, ...], *, state: str | None = None
    ) -> None:
        """From now on, the governor's death kills ``kill`` (relative to ``cgroup_root``) and
        removes the ``remove`` cgroups, in that order (children first), and the published
        ``state`` file (governor/rundir/state.py) while it still names this process."""
        lines = [f"root {cgroup_root}", f"kill {kill}", *(f"rmdir {d}" for d in remove)]
        if state is not None:
            lines.append(f"state {os.getpid()} {state}")
        if any("\n" in line for line in lines):
            raise ValueError(f"a cgroup path with a newline cannot be armed: {lines!r}")
        self._send(("\n".join(lines) + "\n").encode())

    def arm_thaw(self, cgroup_root: str, group: str) -> None:
        """From now on, the governor's death thaws ``group`` (a monitor attached to a slice it
        does not own: a `freeze` action must not outlive it, whatever ends it)."""
        lines = [f"root {cgroup_root}", f"thaw {group}"]
        if any("\n" in line for line in lines):
            raise ValueError(f"a cgroup path with a newline cannot be armed: {lines!r}")
        self._send(("\n".join(lines) + "\n").encode())

    def arm_clocks(self, run_dir: str, policy: str, pid: int, sysfs_root: str) -> None:
        """From now on, the governor's death also releases its hold on the board's clocks
        (governor/backends/clocks.py, run with this interpreter after the cgroups went):
        restored when it was the last holder."""

        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        lines = [
            f"clockpy {sys.executable}",
            f"clockpath {os.path.dirname(package)}",
            f"clockdir {run_dir}",
            f"clocksys {sysfs_root}",
            f"clocks {policy} {pid}",
        ]
        if any("\n" in line for line in lines):
            raise ValueError(f"a path with a newline cannot be armed: {lines!r}")
        self._send(("\n".join(lines) + "\n").encode())

    def arm_shed(self, cgroup_root: str, reverts: list[tuple[str, str, str]]) -> None:
        """From now on, the governor's death reverts what its `shed` holds (governor/monitor/
        shed.py): ``(op, value, cgroup)`` with op "thaw" (value unused) or "high" (memory.high
        := value). Each call replaces the previous list; an empty list reverts nothing."""
        lines = [f"shedroot {cgroup_root}", "shed-reset"]
        lines += [f"shed {op} {value or '-'} {cg}" for op, value, cg in reverts]
        if any("\n" in line for line in lines) or any(" " in f"{v}{c}" for _, v, c in reverts):
            raise ValueError(f"a shed revert with a newline or a space cannot be armed: {lines!r}")
        self._send(("\n".join(lines) + "\n").encode())

    def disarm(self) -> None:
        """The governor cleans up (or has nothing to clean): the watchdog exits untouched."""
        if self.fd is None:
            return
        try:
            with contextlib.suppress(OSError):  # a watchdog that died already
                self._send(DISARM)
        finally:
            os.close(self.fd)
            self.fd = None
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)

    def _send(self, data: bytes) -> None:
        if self.fd is None:
            raise ValueError("watchdog already disarmed")
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def fork_watchdog(shell: str = SHELL) -> Watchdog:
    """Start the watchdog now (call it before heavy imports); it waits, unarmed."""
    r, w = os.pipe2(os.O_CLOEXEC)  # the engine never holds either end
    script = _SCRIPT.replace("WAIT_S", str(WAIT_EMPTY_S))
    # posix_spawn (vfork + exec): the shell runs at once, no copy-on-write of this process
    # (a forked child took 20+ ms to reach exec on a loaded 2-core board, and disarm waited
    # for it). Ignored dispositions survive exec: ignore the stop signals around the spawn.
    actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, r, 0)]
    try:
        inherited = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        inherited = []
    for fd in inherited:
        if fd > 2 and fd not in (r, w):
            try:
                if os.get_inheritable(fd):
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
            except OSError:
                pass  # the listing's own descriptor, closed meanwhile
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    before = [signal.signal(sig, signal.SIG_IGN) for sig in stops]
    try:
        pid = os.posix_spawn(
            shell, [shell, "-c", script], os.environ, file_actions=actions, setsid=True
        )
    finally:
        for sig, handler in zip(stops, before, strict=True):
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    os.close(r)
    return Watchdog(pid, w)
