"""Shell completion: the protocol is click's (``_GOVERNOR_COMPLETE=bash_complete governor``, the
scripts in share/ come from ``python -m governor.cli.manual``); this module adds what click cannot
know: the names of governed policies (`status`, `tune`, `rollback` NAME) and policy files
(`check`, `plan`, `launch -p`, ...). A completer never raises: a TAB must not print a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import click

COMPLETE_VAR = "_GOVERNOR_COMPLETE"  # click's default for prog_name "governor"
INSTALLED = Path("etc/governor/installed")  # governor/deploy/install.py MANIFEST_DIR, under /


def policy_names(incomplete: str, run_dir: Path, root: Path = Path("/")) -> list[str]:
    """The names `status/tune/rollback` take: every policy with a run directory (a running or
    applied slice) and every installed one (its manifest), that start with ``incomplete``.
    No pydantic here (NAME_RE's module): a TAB pays only for the typer app's import."""
    names: set[str] = set()
    for directory, suffix in ((run_dir, None), (root / INSTALLED, ".json")):
        try:
            entries = list(directory.iterdir())
        except OSError:
            continue
        for entry in entries:
            if suffix is None and entry.is_dir():
                names.add(entry.name)
            elif suffix is not None and entry.name.endswith(suffix):
                names.add(entry.name.removesuffix(suffix))
    return sorted(n for n in names if n.startswith(incomplete) and not n.startswith("."))


def policy_files(incomplete: str, cwd: Path | None = None) -> list[str]:
    """``*.toml`` files and directories (with a trailing /) that start with ``incomplete``,
    relative the way it was typed; dot entries only when the typed name starts with a dot."""
    base = Path.cwd() if cwd is None else cwd
    head, _, stem = incomplete.rpartition("/")
    prefix = f"{head}/" if head or incomplete.startswith("/") else ""
    directory = base / os.path.expanduser(prefix) if prefix else base
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    out: list[str] = []
    for entry in entries:
        name = entry.name
        if not name.startswith(stem) or (name.startswith(".") and not stem.startswith(".")):
            continue
        if entry.is_dir():
            out.append(f"{prefix}{name}/")
        elif name.endswith(".toml"):
            out.append(f"{prefix}{name}")
    return out


def complete_policy_name(incomplete: str) -> list[str]:
    """typer's autocompletion for a policy NAME."""
    from governor.rundir.state import run_dir

    try:
        return policy_names(incomplete, run_dir())
    except Exception:  # a TAB prints nothing rather than a traceback
        return []


def complete_policy_file(incomplete: str) -> list[str]:
    """typer's autocompletion for a policy FILE."""
    try:
        return policy_files(incomplete)
    except Exception:  # a TAB prints nothing rather than a traceback
        return []


def complete_policy_name_or_file(incomplete: str) -> list[str]:
    """`uninstall` takes either."""
    return complete_policy_name(incomplete) + complete_policy_file(incomplete)


def answer(command: click.Command, instruction: str) -> int:
    """Answer one completion request (click's protocol: ``bash_complete``, ``zsh_source``,
    ...). typer 0.21 reads the instruction the other way round (``complete_bash``) and only
    with its own --install-completion, which governor does not offer: the scripts it ships
    are click's."""
    from click.shell_completion import shell_complete

    return shell_complete(command, {}, "governor", COMPLETE_VAR, instruction)
