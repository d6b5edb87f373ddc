#!/usr/bin/python
"""governor.board.policy: a governor policy installed (and its engine running) on a board.

Runs with the board's Python and drives the board's `governor` command line: `install --json
[--dry-run]` (diff first, atomic, idempotent), `diff --json` (the drift it reports), `tune
--confirm` (a live change that reverts by itself unless confirmed), `uninstall --json`, and
`systemctl start/restart/stop governor@NAME`. Nothing here reimplements what governor does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule

Json = dict[str, Any]

DOCUMENTATION = r"""
---
module: policy
short_description: Install a governor policy on a board and run its engine under it
description:
  - Renders and installs the systemd slice and C(governor@NAME) drop-in of a governor policy with
    C(governor install), idempotently; a second run with the same policy reports C(ok).
  - In check mode it runs C(governor install --dry-run) and C(governor diff --json) and reports
    what would change, in Ansible's C(--diff) format, without touching the board.
  - With O(live=true) a running engine whose policy changed only in its limits is tuned in place
    with C(governor tune NAME KEY=VALUE --confirm DURATION) (through systemd on the board), kept
    with C(governor tune NAME --confirm) once the service is still active, and the unit files
    are then rewritten to match; a change that cuts the board off reverts by itself.
  - Errors fail the task with governor's one-line message and its hint.
version_added: "0.1.0"
author: governor
options:
  policy:
    description:
      - The policy file. A path on the board, or with O(copy=true) a file on the controller that
        is copied (with every file it C(extends)) to O(policy_dir) on the board.
      - With O(state=absent) also a policy name.
    type: str
    required: true
  state:
    description: C(present) installs (and with O(started) runs) it; C(absent) stops and uninstalls it.
    type: str
    choices: [present, absent]
    default: present
  engine:
    description: The engine command (argv list) for the service's C(ExecStart=).
    type: list
    elements: str
    default: []
  started:
    description:
      - Start C(governor@NAME) when it is not active, restart it when the install changed
        something (unless O(live) tuned it in place).
    type: bool
    default: false
  live:
    description:
      - When the service runs and only limits changed (the policy slice's Memory*, CPU*,
        AllowedCPUs, TasksMax, IOWeight), tune them in place with C(--confirm) instead of a
        reinstall and restart.
    type: bool
    default: false
  confirm:
    description: The C(--confirm) window of a live tune; unconfirmed by then, the change reverts.
    type: str
    default: 2m
  copy:
    description:
      - Copy O(policy) from the controller (the action plugin reads it there).
      - With O(state=absent) the copied policy file is removed too when it still holds the
        controller's text (the files it extends stay: other policies may use them).
    type: bool
    default: false
  policy_dir:
    description: Where a copied policy goes on the board (under O(root)).
    type: str
    default: /etc/governor
  policy_files:
    description: Set by the action plugin with O(copy=true) (file name to text); not for playbooks.
    type: dict
  root:
    description: Install under this directory instead of / (C(governor install --root)); no systemctl.
    type: path
    default: /
  probe_root:
    description: Probe /proc and /sys under this directory (the global C(governor --root)).
    type: path
  allow_missing:
    description: Controllers to run without (C(--allow-missing)); their limits are not in force.
    type: str
  executable:
    description: The governor command (default C(governor) in PATH, /opt/governor/bin, /usr/local/bin).
    type: path
notes:
  - Supports check mode and diff mode.
"""

EXAMPLES = r"""
- name: Chat engine on every board, limits tuned live
  governor.board.policy:
    policy: policies/npu-chat.toml
    copy: true
    engine: [/opt/llama/llama-server, -m, /models/q4.gguf, -c, "2048", --port, "8080"]
    started: true
    live: true

- name: Gone from the board
  governor.board.policy:
    policy: npu-chat
    state: absent
"""

RETURN = r"""
name:
  description: The policy's name.
  returned: always
  type: str
units:
  description: The units install writes (the policy slice, the service instance).
  returned: when installed
  type: list
  elements: str
files:
  description: The files that changed (or would change in check mode), relative to O(root).
  returned: always
  type: list
  elements: str
tuned:
  description: KEY=VALUE tuned live (O(live)), kept with C(governor tune NAME --confirm).
  returned: when a live tune happened or would happen
  type: list
  elements: str
service:
  description: What was done to C(governor@NAME) (started, restarted, stopped).
  returned: when the service was acted on
  type: str
drift:
  description: C(governor diff --json) of the policy on the live board (the kernel, the units, the prerequisites).
  returned: in check mode on the live board
  type: dict
"""

GOVERNOR_LINE = re.compile(r"^governor: .*$", re.MULTILINE)


class Board:
    """The governor command line and systemctl on this board."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        p = module.params
        self.exe = p["executable"] or module.get_bin_path(
            "governor", opt_dirs=["/opt/governor/bin", "/usr/local/bin"]
        )
        if not self.exe:
            module.fail_json(msg="governor: command not found (PATH, /opt/governor/bin)")
        self.root = p["root"]
        self.live_board = os.path.realpath(self.root) == "/"

    def governor(self, *args: str, ok: tuple[int, ...] = (0,)) -> tuple[int, str]:
        argv = [self.exe]
        if self.module.params["probe_root"]:
            argv += ["--root", self.module.params["probe_root"]]
        argv += list(args)
        # byte for byte: run_command's default expands $VAR, ${VAR} and ~ in every word from
        # the board's environment (an engine's `--api-key $TOKEN` would land in ExecStart=)
        rc, out, err = self.module.run_command(argv, expand_user_and_vars=False)
        if rc not in ok:
            self.fail(rc, err, out, argv)
        return rc, out

    def fail(self, rc: int, err: str, out: str, argv: list[str]) -> None:
        first = GOVERNOR_LINE.search(err or "")
        hint = re.search(r"^hint: (.*)$", err or "", re.MULTILINE)
        self.module.fail_json(
            msg=first.group(0) if first else f"governor exited {rc}: {(err or out).strip()}",
            hint=hint.group(1) if hint else None,
            rc=rc,
            cmd=argv,
            stderr=err,
        )

    def install(self, policy: str, dry_run: bool) -> Json:
        p = self.module.params
        args = ["install", policy, "--json", "--root", self.root]
        if dry_run:
            args.append("--dry-run")
        if p["allow_missing"]:
            args += ["--allow-missing", p["allow_missing"]]
        if p["engine"]:
            args += ["--", *p["engine"]]
        out: Json = json.loads(self.governor(*args)[1])
        return out

    def uninstall(self, policy: str, dry_run: bool) -> Json | None:
        args = ["uninstall", policy, "--json", "--root", self.root]
        rc, out = self.governor(*(args + (["--dry-run"] if dry_run else [])), ok=(0, 66))
        if rc != 0:
            return None  # 66: not installed
        doc: Json = json.loads(out)
        return doc

    def systemctl(self, *args: str, check: bool = True) -> int:
        rc, _out, err = self.module.run_command(["systemctl", *args], expand_user_and_vars=False)
        if check and rc != 0:
            self.module.fail_json(msg=f"systemctl {' '.join(args)} failed ({rc})", stderr=err)
        return int(rc)

    def active(self, service: str) -> bool:
        if not self.live_board:
            return False
        return self.systemctl("is-active", "--quiet", service, check=False) == 0


def _directives(text: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def only_limits(changes: list[Json], slice_unit: str, tunable: dict[str, str]) -> list[str] | None:
    """KEY=VALUE for `governor tune` when the only change is limit directives of the policy
    slice; None when anything else changed (a restart is needed). ``tunable``: [Slice]
    directive -> the key `governor tune` takes, from `install --json` (the governor's own
    table; an older governor gives none: every change restarts)."""
    tune: list[str] = []
    for c in changes:
        if not c["path"].endswith("/" + slice_unit):
            return None
        if c["before"] is None or c["after"] is None:
            return None
        before, after = _directives(c["before"]), _directives(c["after"])
        if set(before) != set(after):
            return None
        for key in sorted(after):
            if before[key] == after[key]:
                continue
            if key not in tunable:
                return None
            value = "max" if after[key] == "infinity" else after[key]
            tune.append(f"{tunable[key]}={value}")
    return tune or None


def _service(units: list[str]) -> str:
    return next(u for u in units if u.startswith("governor@"))


def _diff(changes: list[Json]) -> list[Json]:
    return [
        {
            "before_header": c["path"],
            "after_header": c["path"],
            "before": c["before"] or "",
            "after": c["after"] or "",
        }
        for c in changes
    ]


def _place_policy(module: AnsibleModule, board: Board, result: Json) -> str:
    """With copy: write the controller's policy files under policy_dir (only those that
    differ); in check mode into a temporary directory instead. Returns the policy path."""
    p = module.params
    files: dict[str, str] = p["policy_files"] or {}
    main = os.path.basename(str(p["policy"]))
    if main not in files:
        module.fail_json(msg="governor: copy=true needs the action plugin (governor.board.policy)")
    dest = os.path.join(board.root, str(p["policy_dir"]).lstrip("/"))
    changes: list[tuple[str, str | None, str]] = []  # (path, before, after)
    for name, text in sorted(files.items()):
        if os.path.isabs(name) or ".." in name.split("/"):
            module.fail_json(msg=f"governor: policy file {name!r} is outside {p['policy_dir']}")
        path = os.path.join(dest, name)
        try:
            with open(path, encoding="utf-8") as f:
                old: str | None = f.read()
        except OSError:
            old = None
        if old != text:
            changes.append((path, old, text))
    shown = [{"path": path.lstrip("/"), "before": old, "after": new} for path, old, new in changes]
    result["changed_files"] += [c["path"] for c in shown]
    result["diff_items"] += _diff(shown)
    if module.check_mode and changes:
        # the board stays as it is: the install's dry run reads a temporary copy
        tmp = tempfile.mkdtemp(prefix="governor-check-")
        result["_check_dir"] = (tmp, dest)
        dest = tmp
        changes = [(os.path.join(tmp, n), None, t) for n, t in files.items()]
    for path, _, text in changes:
        _write(path, text)
    return os.path.join(dest, main)


def _write(path: str, text: str) -> None:
    """Atomically: a temporary file beside it, fsync, rename."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd, part = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".governor-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(part, 0o644)
    os.replace(part, path)


def present(module: AnsibleModule, board: Board, result: Json) -> None:
    p = module.params
    if p["started"] and not board.live_board:
        module.fail_json(msg=f"governor: started needs the live board (root is {board.root})")
    policy = _place_policy(module, board, result) if p["copy"] else p["policy"]
    try:
        _present(module, board, result, policy)
    finally:  # check mode's temporary copy: kept until the last command that reads it
        check_dir = result.pop("_check_dir", None)
        if check_dir is not None:
            shutil.rmtree(check_dir[0], ignore_errors=True)


def _present(module: AnsibleModule, board: Board, result: Json, policy: str) -> None:
    p = module.params
    # check mode, and a live tune, need to know the change before it is made; otherwise
    # install itself is diff first, atomic and idempotent: one call
    dry_run = module.check_mode or p["live"]
    planned = board.install(policy, dry_run=dry_run)
    check_dir = result.get("_check_dir")
    if check_dir is not None:  # rendered from the temporary copy: name the real path
        tmp, dest = check_dir
        for c in planned["changes"]:
            if c["after"] is not None:
                c["after"] = c["after"].replace(tmp, dest)
    changes = [c for c in planned["changes"] if c["before"] != c["after"]]
    service = _service(planned["units"])
    name = service[len("governor@") : -len(".service")]
    result.update(name=name, units=planned["units"])
    result["changed_files"] += [c["path"] for c in changes]
    result["diff_items"] += _diff(changes)
    running = board.active(service)
    slice_unit = planned["units"][0]
    live = p["live"] and running
    tune = only_limits(changes, slice_unit, planned.get("tunable") or {}) if live else None
    if tune:
        result["tuned"] = tune
    if module.check_mode:
        if board.live_board:  # what the board runs vs this policy: kernel, units, prerequisites
            result["drift"] = json.loads(board.governor("diff", "--json", policy, ok=(0, 1))[1])
        if p["started"] and (not running or (changes and not tune)):
            result["service"] = "would restart" if running else "would start"
        return
    if tune:
        board.governor("tune", name, *tune, "--confirm", p["confirm"])
        if not board.active(service):
            module.fail_json(
                msg=f"governor: {service} is not active after the live tune (not confirmed: it"
                f" reverts within {p['confirm']})",
                tuned=tune,
            )
        board.governor("tune", name, "--confirm")
    if dry_run and changes:
        board.install(policy, dry_run=False)
    if p["started"]:
        if not running:
            board.systemctl("start", service)
            result["service"] = "started"
        elif changes and not tune:
            board.systemctl("restart", service)
            result["service"] = "restarted"
    elif running and changes and not tune:
        module.warn(f"{service} runs the previous policy until restarted (started: true does)")


def _copied(module: AnsibleModule, board: Board) -> str | None:
    """With copy: the policy file a present run put on the board, when it still holds the
    controller's text (a file edited on the board since is left alone). Files it extends stay:
    other policies may extend them too."""
    p = module.params
    main = os.path.basename(str(p["policy"]))
    text = (p["policy_files"] or {}).get(main)
    path = os.path.join(board.root, str(p["policy_dir"]).lstrip("/"), main)
    try:
        with open(path, encoding="utf-8") as f:
            return path if text is not None and f.read() == text else None
    except OSError:
        return None


def absent(module: AnsibleModule, board: Board, result: Json) -> None:
    copied = _copied(module, board) if module.params["copy"] else None
    policy = copied or module.params["policy"]
    if not os.path.exists(policy):
        policy = os.path.basename(policy).removesuffix(".toml")
    planned = board.uninstall(policy, dry_run=True)
    if copied is not None:
        result["changed_files"].append(copied.lstrip("/"))
        if not module.check_mode and planned is None:
            os.unlink(copied)
    if planned is None:
        return  # not installed: nothing to do
    service = _service(planned["units"])
    result.update(name=service[len("governor@") : -len(".service")], units=planned["units"])
    result["changed_files"] += [c["path"] for c in planned["changes"]]
    result["diff_items"] += _diff(planned["changes"])
    running = board.active(service)
    if module.check_mode:
        if running:
            result["service"] = "would stop"
        return
    if running:
        board.systemctl("stop", service)
        result["service"] = "stopped"
    board.uninstall(policy, dry_run=False)
    if copied is not None:
        os.unlink(copied)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "policy": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "engine": {"type": "list", "elements": "str", "default": []},
            "started": {"type": "bool", "default": False},
            "live": {"type": "bool", "default": False},
            "confirm": {"type": "str", "default": "2m"},
            "copy": {"type": "bool", "default": False},
            "policy_dir": {"type": "str", "default": "/etc/governor"},
            "policy_files": {"type": "dict"},
            "root": {"type": "path", "default": "/"},
            "probe_root": {"type": "path"},
            "allow_missing": {"type": "str"},
            "executable": {"type": "path"},
        },
        supports_check_mode=True,
    )
    board = Board(module)
    result: Json = {"changed_files": [], "diff_items": []}
    if module.params["state"] == "present":
        present(module, board, result)
    else:
        absent(module, board, result)
    files = result.pop("changed_files")
    diff = result.pop("diff_items")
    changed = bool(files) or "service" in result or "tuned" in result
    out = {"changed": changed, "files": files, **result}
    if module._diff:
        out["diff"] = diff
    module.exit_json(**out)


if __name__ == "__main__":
    main()
