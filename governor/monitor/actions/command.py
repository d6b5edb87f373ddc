"""``exec ARGV...``: the operator's command, run with the firing in its environment
(GOVERNOR_RULE, GOVERNOR_WHEN, ...), as the policy's process.user, with a clean environment and
a timeout. This module (and subprocess with it) loads only for a plan with an exec rule."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
from typing import Any

from governor.log import get_logger
from governor.monitor.actions.base import Context, Handler, Result
from governor.plan.model import Action

log = get_logger(__name__)

EXEC_TIMEOUT_S = 10.0  # an exec action's command is killed after this
EXEC_OUTPUT_MAX = 4096  # bytes of stdout/stderr kept in the log
EXEC_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_EXEC_KEPT_ENV = ("LANG", "LC_ALL", "TZ")


class Exec(Handler):
    def run(self, action: Action, ctx: Context) -> Result:
        env_ = self.env
        try:
            identity = exec_identity(env_.plan.launch.user, env_.plan.launch.group)
        except KeyError as err:
            return Result(str(action), ok=False, detail=f"cannot run as {err.args[0]}")
        env = exec_environment(identity.get("env", {}))
        env.update(ctx.env(f"{env_.plan.cgroup_root}/{env_.group}"))
        run = env_.run or subprocess.run
        try:
            done = run(
                list(action.argv),
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=EXEC_TIMEOUT_S,
                check=False,
                close_fds=True,
                cwd="/",
                user=identity.get("user"),
                group=identity.get("group"),
                extra_groups=identity.get("extra_groups"),
            )
        except subprocess.TimeoutExpired as err:
            return Result(
                str(action),
                ok=False,
                detail=f"killed after {EXEC_TIMEOUT_S:g}s",
                after={"stdout": _cut(err.stdout)},
            )
        except subprocess.SubprocessError as err:
            return Result(str(action), ok=False, detail=f"{type(err).__name__}: {err}")
        return Result(
            str(action),
            ok=done.returncode == 0,
            after={
                "exit": done.returncode,
                "stdout": _cut(done.stdout),
                "stderr": _cut(done.stderr),
            },
        )


def exec_identity(user: str | None, group: str | None) -> dict[str, Any]:
    """How an exec action runs: as the policy's process.user/group (never as root with the
    governor's privileges when the engine itself runs unprivileged). Without privileges to
    switch, as the governor's own user, said in the log. KeyError names an unknown user/group."""
    if user is None and group is None:
        return {}
    if os.geteuid() != 0:
        log.warning(
            "action.exec.as_self",
            user=user,
            group=group,
            reason="the governor is not root and cannot switch to process.user",
        )
        return {}
    out: dict[str, Any] = {}
    if user is not None:
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise KeyError(f"process.user {user!r} (no such user)") from None
        out["user"] = pw.pw_uid
        out["group"] = pw.pw_gid
        out["extra_groups"] = os.getgrouplist(pw.pw_name, pw.pw_gid)
        out["env"] = {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name}
    if group is not None:
        try:
            out["group"] = grp.getgrnam(group).gr_gid
        except KeyError:
            raise KeyError(f"process.group {group!r} (no such group)") from None
        out.setdefault("extra_groups", [out["group"]])
    return out


def exec_environment(identity_env: dict[str, str]) -> dict[str, str]:
    """A clean environment for an exec action: a fixed PATH, the locale, the user's HOME/USER;
    nothing else of the governor's (no secrets a service's environment may hold)."""
    env = {"PATH": EXEC_PATH}
    env.update({k: os.environ[k] for k in _EXEC_KEPT_ENV if k in os.environ})
    env.update(identity_env)
    return env


def _cut(data: bytes | str | None) -> str | None:
    if not data:
        return None
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return text[-EXEC_OUTPUT_MAX:]
