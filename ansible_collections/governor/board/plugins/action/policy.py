"""Action plugin of governor.board.policy: with ``copy: true`` read the policy on the
controller, with every file it ``extends`` (relative to it), and hand their text to the module,
which writes them on the board; then run the module there."""

from __future__ import annotations

import os
import re

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

EXTENDS = re.compile(r"""^\s*extends\s*=\s*(["'])(?P<path>[^"']+)\1""", re.MULTILINE)


def policy_files(path: str) -> dict[str, str]:
    """{name relative to the policy's directory: text} for the policy and its extends chain."""
    base = os.path.dirname(os.path.abspath(path))
    out: dict[str, str] = {}
    current: str | None = os.path.abspath(path)
    while current is not None:
        name = os.path.relpath(current, base)
        if name in out:
            break  # a loop: governor itself says so on the board
        if name.startswith(".."):
            raise AnsibleActionFail(f"governor: {path} extends {current}, outside its directory")
        try:
            with open(current, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise AnsibleActionFail(f"governor: cannot read {current} ({err.strerror})") from err
        out[name] = text
        match = EXTENDS.search(text)
        current = os.path.join(os.path.dirname(current), match["path"]) if match else None
        current = os.path.normpath(current) if current else None
    return out


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):  # type: ignore[no-untyped-def]  # Ansible's API
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get("copy"):
            source = self._find_needle("files", args["policy"])
            args["policy_files"] = policy_files(source)
        result.update(
            self._execute_module(
                module_name="governor.board.policy", module_args=args, task_vars=task_vars
            )
        )
        return result
