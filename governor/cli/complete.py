"""Shell completion: the protocol is click's (``_GOVERNOR_COMPLETE=bash_complete governor``, the
scripts in share/ come from ``python -m governor.cli.manual``); this module adds what click cannot
know: the names of governed policies (`status`, `tune`, `rollback` NAME) and policy files
(`check`, `plan`, `launch -p`, ...). A completer never raises: a TAB must not print a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.shell_completion import (
    BashComplete,
    ShellComplete,
    add_completion_class,
    get_completion_class,
)

from governor.cli.choices import COMPLETE_VAR

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


# click 8's bash script with its two unquoted expansions quoted (issue 43): `for c in $response`
# and `COMPREPLY+=($value)` glob-expand an answer, so a policy file named `*.toml` completed to
# every TOML file of the directory and `[ab].toml` to a.toml and b.toml. Here each answer line
# is read as it is, and a plain value is put on the command line escaped (`printf %q`, a
# leading `~` left to the shell's tilde expansion), so it names that one file when run.
_BASH_SOURCE = """\
%(complete_func)s() {
    local IFS=$'\\n'
    local response type value

    response=$(env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD=$COMP_CWORD \\
        %(complete_var)s=bash_complete "$1")

    while IFS=',' read -r type value; do
        if [[ $type == 'dir' ]]; then
            COMPREPLY=()
            compopt -o dirnames
        elif [[ $type == 'file' ]]; then
            COMPREPLY=()
            compopt -o default
        elif [[ $type == 'plain' ]]; then
            printf -v value '%%q' "$value"
            [[ $value == '\\~'* ]] && value=${value:1}
            COMPREPLY+=("$value")
        fi
    done <<< "$response"

    return 0
}

%(complete_func)s_setup() {
    complete -o nosort -F %(complete_func)s %(prog_name)s
}

%(complete_func)s_setup;
"""


class QuotedBashComplete(BashComplete):
    """click's bash completion with every answer taken literally (_BASH_SOURCE)."""

    source_template = _BASH_SOURCE


def completion_class(shell: str) -> type[ShellComplete] | None:
    """The completion a shell gets: click's, with bash's script quoted."""
    if shell == "bash":
        return QuotedBashComplete
    return get_completion_class(shell)


def answer(command: click.Command, instruction: str) -> int:
    """Answer one completion request (click's protocol: ``bash_complete``, ``zsh_source``,
    ...). typer 0.21 reads the instruction the other way round (``complete_bash``) and only
    with its own --install-completion, which governor does not offer: the scripts it ships
    are click's."""
    from click.shell_completion import shell_complete

    add_completion_class(QuotedBashComplete)  # `bash_source` prints the shipped script
    return shell_complete(command, {}, "governor", COMPLETE_VAR, instruction)
