"""What the engine's child does between fork and exec (launcher.ChildSetup), resolved in the
parent from the plan's [process] section: the environment, and process.user / process.group
looked up in this host's account database (a missing one is 69 before anything is applied)."""

from __future__ import annotations

import grp
import os
import pwd

from governor.errors import HostError
from governor.launch.launcher import ChildSetup
from governor.plan.model import Plan


def _user(plan: Plan, name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise HostError(
            f"process.user {name!r} does not exist on this host"
            f" ({plan.source or 'policy'}, process.user; /etc/passwd)",
            hint=f"useradd --system {name}, or change process.user",
        ) from None


def _gid(plan: Plan, name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise HostError(
            f"process.group {name!r} does not exist on this host"
            f" ({plan.source or 'policy'}, process.group; /etc/group)",
            hint=f"groupadd --system {name}, or change process.group",
        ) from None


def child_setup(plan: Plan, executable: str, argv: tuple[str, ...]) -> ChildSetup:
    """The child's executable, argv, environment and identity for this plan."""
    env = dict(os.environ)
    env.update(plan.launch.env)
    uid = gid = None
    user = home = None
    if plan.launch.user is not None:
        pw = _user(plan, plan.launch.user)
        uid, gid, user, home = pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir
        env.update({"USER": user, "LOGNAME": user, "HOME": home})
    if plan.launch.group is not None:
        gid = _gid(plan, plan.launch.group)
    return ChildSetup(
        executable=executable,
        argv=argv,
        env=env,
        uid=uid,
        gid=gid,
        user=user,
        home=home,
        pdeathsig=plan.launch.on_governor_exit == "kill",
    )
