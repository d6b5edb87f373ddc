"""What the commands share: the global options' state, the option types more than one command
takes, and the converters for values that need more than typer's own checks."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer

from governor.cli.choices import METRICS_ENV, PSI_MODES
from governor.cli.complete import complete_policy_file, complete_policy_name
from governor.errors import UsageError
from governor.errors import UsageError as GovernorUsage
from governor.kernel.files import MISSABLE
from governor.metrics.listen import parse_listen

if TYPE_CHECKING:
    from governor.api.host import HostOptions


def split_argv(text: str, option: str = "--engine-argv") -> tuple[str, ...]:
    """An engine command line given as one string, split like a shell would (no expansion)."""

    try:
        return tuple(shlex.split(text))
    except ValueError as err:  # an unbalanced quote
        raise GovernorUsage(
            f"cannot split {option}: {err} ({option})",
            hint=f"quote {option} as one shell word: {option} 'llama-cli -m model.gguf -c 2048'",
        ) from None


class _State:
    debug = False
    root = Path("/")
    cgroup_root: Path | None = None
    sysfs_root: Path | None = None


STATE = _State()


PolicyArg = Annotated[
    Path,
    typer.Argument(
        help="policy TOML file", show_default=False, autocompletion=complete_policy_file
    ),
]
# a governed policy's name (`status`, `tune`, `rollback`, `metrics`): TAB offers the live ones
NAME_COMPLETION = {"autocompletion": complete_policy_name}


AllowMissing = Annotated[
    str,
    typer.Option(
        "--allow-missing",
        help="comma list of controllers (memory,cpu,cpuset,io,pids), 'psi' or 'zswap' to run"
        " without; the limits they carry are reported as NOT in force",
    ),
]


def finite(value: float | None) -> float | None:
    """typer's ranges compare, and every comparison with NaN is False: refuse it here."""
    if value is not None and value != value:  # noqa: PLR0124  # NaN is the one value != itself
        raise typer.BadParameter("nan is not a number of seconds")
    return value


SampleInterval = Annotated[
    float,
    typer.Option(
        "--sample-interval",
        callback=finite,
        help="seconds between samples of memory.current/peak/stat (0.05-3600)",
        min=0.05,
        max=3600.0,
    ),
]


Psi = Annotated[
    str,
    typer.Option(
        "--psi",
        click_type=click.Choice(PSI_MODES),
        help="trigger: PSI trigger fds (the kernel wakes the monitor); poll: read total= at"
        " every sample instead (kernels or delegations that refuse triggers, comparisons)",
    ),
]


def listen_option(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None

    try:
        return parse_listen(text)
    except ValueError as err:
        raise UsageError(
            f"bad --metrics value: {err} (--metrics)",
            hint="--metrics 9101 (loopback), --metrics 0.0.0.0:9101, --metrics [::1]:9101",
        ) from None


Metrics = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        envvar=METRICS_ENV,
        show_envvar=True,
        help="serve Prometheus /metrics on [ADDR:]PORT while it runs (ADDR defaults to"
        " 127.0.0.1; see docs/metrics.md)",
    ),
]


Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="go ahead even when the GGUF memory estimate exceeds memory.max or the board"
        " cannot admit it (exit 75)",
    ),
]


def host_options(allow_missing: str = "") -> HostOptions:
    from governor.api.host import HostOptions

    allowed = frozenset(a.strip() for a in allow_missing.split(",") if a.strip())

    unknown = allowed - MISSABLE
    if unknown:
        raise UsageError(
            f"unknown name in --allow-missing: {','.join(sorted(unknown))} (--allow-missing)",
            hint="use memory, cpu, cpuset, io, pids, psi or zswap",
        )
    return HostOptions(
        root=STATE.root,
        cgroup_root=STATE.cgroup_root,
        allow_missing=allowed,
        sysfs_root=STATE.sysfs_root,
    )


def exclusive(option_a: str, a_given: bool, option_b: str, b_given: bool, hint: str) -> None:
    """Two options that contradict each other: a usage error (2), never one silently winning."""
    if a_given and b_given:
        raise UsageError(
            f"{option_a} and {option_b} are mutually exclusive ({option_a}, {option_b})",
            hint=hint,
        )


# the least RAM a board option may name: a bare number is bytes, so `--board-memory 2048`
# (meant as MiB) would size a 2 KiB board and refuse every model as if the board had none
BOARD_FLOOR = 64 << 20


def size_option(text: str | None, option: str, *, at_least: int = 0) -> int | None:
    """A size option's bytes (None: not given); below ``at_least``: a usage error (2) that
    says a bare number is bytes."""
    if text is None:
        return None
    from governor.policy.values import parse_size

    try:
        size = parse_size(text).bytes
    except ValueError as err:
        raise UsageError(f"not a size: {text!r} ({err}) ({option})", hint="e.g. 1900M") from err
    if size < at_least:
        raise UsageError(
            f"{text!r} is {size} bytes, less than a board's {at_least >> 20} MiB ({option})",
            hint="a bare number is bytes: give a unit, e.g. 2G or 2048M",
        )
    return size
