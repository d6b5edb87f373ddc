"""Deployment commands: `install` and `uninstall` (systemd units, governor/deploy/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from governor.cli.options import AllowMissing, PolicyArg, host_options

InstallRoot = Annotated[
    Path,
    typer.Option(
        "--root",
        help="write under this directory instead of / (a DESTDIR; the global --root, before"
        " the command, is where /proc and /sys are probed)",
    ),
]


DryRun = Annotated[bool, typer.Option("--dry-run", help="show the diff, write nothing")]


def install(
    policy: PolicyArg,
    engine: Annotated[
        list[str] | None,
        typer.Argument(help="optional engine command after --, for the unit's ExecStart="),
    ] = None,
    root: InstallRoot = Path("/"),
    dry_run: DryRun = False,
    allow_missing: AllowMissing = "",
) -> None:
    """Write the policy's systemd slice and governor@ service drop-in (diff shown first)."""
    from governor.api import deploy as api_deploy
    from governor.cli.render import show_install

    result = api_deploy.install(
        policy,
        host_options(allow_missing),
        api_deploy.InstallOptions(root=root, dry_run=dry_run, engine=tuple(engine or ())),
    )
    show_install(result, "installed" if not dry_run else "would install", dry_run)


def uninstall(
    policy: Annotated[str, typer.Argument(help="policy TOML file or policy name")],
    root: InstallRoot = Path("/"),
    dry_run: DryRun = False,
) -> None:
    """Remove exactly what `governor install` wrote for the policy; restore what it replaced."""
    from governor.api import deploy as api_deploy
    from governor.cli.render import show_install

    result = api_deploy.uninstall(policy, root, dry_run=dry_run)
    show_install(result, "uninstalled" if not dry_run else "would uninstall", dry_run)
