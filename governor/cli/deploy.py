"""Deployment commands: `install` and `uninstall` (systemd units, governor/deploy/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from governor.cli.complete import complete_policy_name_or_file
from governor.cli.options import AllowMissing, PolicyArg, host_options
from governor.cli.render import show_install, show_install_json

InstallRoot = Annotated[
    Path,
    typer.Option(
        "--root",
        help="write under this directory instead of / (a DESTDIR; the global --root, before"
        " the command, is where /proc and /sys are probed)",
    ),
]


DryRun = Annotated[bool, typer.Option("--dry-run", help="show the diff, write nothing")]
AsJson = Annotated[
    bool,
    typer.Option(
        "--json", help="machine-readable: units, each changed file before/after, kept, reloaded"
    ),
]


def install(  # noqa: PLR0917  # typer passes every option as a parameter
    policy: PolicyArg,
    engine: Annotated[
        list[str] | None,
        typer.Argument(help="optional engine command after --, for the unit's ExecStart="),
    ] = None,
    root: InstallRoot = Path("/"),
    dry_run: DryRun = False,
    allow_missing: AllowMissing = "",
    as_json: AsJson = False,
) -> None:
    """Write the policy's systemd slice and governor@ service drop-in (diff shown first)."""
    from governor.api import deploy as api_deploy

    result = api_deploy.install(
        policy,
        host_options(allow_missing),
        api_deploy.InstallOptions(root=root, dry_run=dry_run, engine=tuple(engine or ())),
    )
    if as_json:
        show_install_json(result, dry_run)
    else:
        show_install(result, "installed" if not dry_run else "would install", dry_run)


def uninstall(
    policy: Annotated[
        str,
        typer.Argument(
            help="policy TOML file or policy name", autocompletion=complete_policy_name_or_file
        ),
    ],
    root: InstallRoot = Path("/"),
    dry_run: DryRun = False,
    as_json: AsJson = False,
) -> None:
    """Remove exactly what `governor install` wrote for the policy; restore what it replaced."""
    from governor.api import deploy as api_deploy

    result = api_deploy.uninstall(policy, root, dry_run=dry_run)
    if as_json:
        show_install_json(result, dry_run)
    else:
        show_install(result, "uninstalled" if not dry_run else "would uninstall", dry_run)


render_app = typer.Typer(
    name="render",
    help="Render the policy for another engine of a fleet: a Kubernetes manifest, a Podman"
    " Quadlet file (printed; nothing is written or applied).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

EngineArgv = Annotated[
    list[str] | None,
    typer.Argument(help="the engine command after -- (its -m model becomes a volume)"),
]
Image = Annotated[
    str,
    typer.Option("--image", help="container image that runs the engine command"),
]
Force = Annotated[
    bool,
    typer.Option("--force", help="render even when the GGUF estimate is above memory.max"),
]


@render_app.command("k8s")
def render_k8s(  # noqa: PLR0917  # typer passes every option as a parameter
    policy: PolicyArg,
    engine: EngineArgv = None,
    image: Image = "docker.io/library/debian:12-slim",
    deployment: Annotated[
        bool, typer.Option("--deployment", help="a one-replica Deployment instead of a Pod")
    ] = False,
    force: Force = False,
    allow_missing: AllowMissing = "",
) -> None:
    """Print a Pod manifest: requests.memory from the GGUF estimate (else memory.min),
    limits.memory from memory.max, cpu from cpu.max/cpus, the QoS class and why, the engine argv,
    the model as a hostPath volume, the readiness probe, resizePolicy; each policy field Pod
    resources cannot express is a comment saying what to use instead."""
    from governor.api import fleet

    typer.echo(
        fleet.render(
            "k8s",
            policy,
            host_options(allow_missing),
            tuple(engine or ()),
            image=image,
            kind="Deployment" if deployment else "Pod",
            force=force,
        ),
        nl=False,
    )


@render_app.command("quadlet")
def render_quadlet(
    policy: PolicyArg,
    engine: EngineArgv = None,
    image: Image = "docker.io/library/debian:12-slim",
    force: Force = False,
    allow_missing: AllowMissing = "",
) -> None:
    """Print a Podman Quadlet .container file whose [Service] carries the policy's slice and
    every limit systemd can set; what it cannot is a comment."""
    from governor.api import fleet

    typer.echo(
        fleet.render(
            "quadlet",
            policy,
            host_options(allow_missing),
            tuple(engine or ()),
            image=image,
            force=force,
        ),
        nl=False,
    )
