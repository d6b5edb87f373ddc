"""Command-line values that need more than typer's own checks."""

from __future__ import annotations

from governor.errors import UsageError as GovernorUsage


def split_argv(text: str, option: str = "--engine-argv") -> tuple[str, ...]:
    """An engine command line given as one string, split like a shell would (no expansion)."""
    import shlex

    try:
        return tuple(shlex.split(text))
    except ValueError as err:  # an unbalanced quote
        raise GovernorUsage(
            f"cannot split {option}: {err} (command line)",
            hint=f"quote {option} as one shell word: {option} 'llama-cli -m model.gguf -c 2048'",
        ) from None
