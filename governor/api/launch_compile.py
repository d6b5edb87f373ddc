"""Compile time for `governor launch`: policy, host, plan and every refusal before apply (the
same preflight as `check --engine-argv`: governor/engines/preflight.py), as the plan cache's
entry. Only a cache miss imports this module: in the isolated child of the lean path
(api/isolate.py), in `install`, and in the typer path's launch; a cached launch never does."""

from __future__ import annotations

import tomllib
from pathlib import Path

from governor.api.host import HostOptions, preflight_engine
from governor.cache import plans as compiled
from governor.compile.placements import compile_placements
from governor.engines.engine_files import engine_file_paths
from governor.engines.llama import EngineArgs, model_parts
from governor.engines.rkllm import parse_rkllm_argv
from governor.engines.router import read_preset, router_models
from governor.log import get_logger
from governor.plan.host import HostFacts
from governor.plan.model import Plan
from governor.supervise.ready import server_url

log = get_logger("governor.launch")


def compile_launch(
    path: Path,
    argv: tuple[str, ...],
    opts: HostOptions,
    *,
    force: bool,
    backend_name: str,
    cwd: Path,
) -> tuple[compiled.Compiled, HostFacts]:
    """The cache entry for a launch of ARGV under the policy at PATH, and the host probed."""
    # under systemd the manager enables controllers along the unit's path itself
    plan, host, checked = preflight_engine(
        path, argv, opts, probe_target=backend_name != "systemd", force=force, cwd=cwd
    )
    for note in checked.notes:
        log.debug("preflight.note", note=note)
    args = checked.args  # the argv preflight_engine read and checked (engine_args)
    files = checked.files
    models = _models(plan, argv, args)
    idents = tuple(
        i
        for i in (
            compiled.file_identity(p)
            for p in [
                *models,
                *files,
                *_projector(args),
                *_router_inputs(args, cwd),
                *_engine_files(args, opts.root),
            ]
        )
        if i is not None
    )
    chain = tuple(
        (p, digest) for p in _policy_chain(path) if (digest := compiled.sha256_file(p)) is not None
    )
    entry = compiled.Compiled(
        plan=plan,
        warnings=tuple(checked.warnings),
        estimate=checked.estimate.to_dict()
        if checked.estimate is not None
        else checked.router  # {"router", "router_max"}: each model's leaf (supervise/models.py)
        if checked.router is not None
        else None,
        prefetch_files=tuple(files),
        prefetch_bytes=checked.prefetch_bytes,
        target=None if backend_name == "systemd" else plan.group,
        chain=chain,
        inputs=idents,
        host_key=compiled.host_key(host),
        placements=_placements(plan, host) if backend_name == "systemd" else (),
        model_bytes=sum(i[3] for i in idents if i[0] in models) if models else None,
        ready_url=ready_url(plan, args),
        ready_server=plan.engine.ready is None and args is not None and args.server,
    )
    return entry, host


def _models(plan: Plan, argv: tuple[str, ...], args: EngineArgs | None) -> list[str]:
    """The model files the engine reads (their identity keys the cache entry)."""
    if plan.engine.kind == "rkllm":  # its .rkllm file: the device memory (engines/rkllm.py)
        return [str(parse_rkllm_argv(argv).model)]
    return [str(p) for p in (model_parts(args.model) if args and args.model else [])]


def _projector(args: EngineArgs | None) -> list[str]:
    """The --mmproj projector (its header sizes the estimate's projector terms)."""
    return [args.mmproj] if args is not None and args.mmproj is not None else []


def _engine_files(args: EngineArgs | None, root: Path) -> list[str]:
    """The engine's binary and the libraries beside it: the estimate counts their bytes
    (governor/engines/engine_files.py), so a new build at the same path compiles again."""
    if args is None or not args.argv:
        return []
    return [str(p) for p in engine_file_paths(args.argv[0], root=root) or []]


def _router_inputs(args: EngineArgs | None, cwd: Path) -> list[str]:
    """llama-server's router: the models directory (its mtime moves when a model is added or
    removed), the preset and every model file the router may load, so a change to any of them
    compiles again (each model's estimate and leaf limit come from them)."""
    if args is None or not args.router:
        return []
    out: list[str] = []
    preset_text = None
    if args.models_preset is not None:
        preset = Path(args.models_preset)
        preset = preset if preset.is_absolute() else cwd / preset
        out.append(str(preset))
        try:
            preset_text = read_preset(preset)
        except OSError:  # not UTF-8, a FIFO, a device, too big: the preflight refused it
            return out
    if args.models_dir is not None:
        base = Path(args.models_dir)
        out.append(str(base if base.is_absolute() else cwd / base))
    try:
        models, _unsized = router_models(args, preset_text=preset_text, cwd=cwd)
    except (OSError, ValueError):
        return out
    for m in models:
        out.append(m.argv[m.argv.index("--model") + 1])
        if "--mmproj" in m.argv:  # a subdirectory's projector (engines/router.py)
            out.append(m.argv[m.argv.index("--mmproj") + 1])
    return out


def ready_url(plan: Plan, args: EngineArgs | None) -> str | None:
    """engine.ready ("exec" = at exec), else llama-server's /health from its --host/--port."""
    if plan.engine.ready is not None:
        return None if plan.engine.ready == "exec" else plan.engine.ready
    if args is not None and args.server:
        return server_url(args.host, args.port)
    return None


def _placements(plan: Plan, host: HostFacts) -> tuple[tuple[str, str, str, Plan], ...]:
    if host.systemd_version is None:
        return ()  # for_launch says why it cannot run
    return tuple(
        (p.mode, p.unit, p.cgroup, p.plan) for p in compile_placements(plan, host.systemd_version)
    )


def _policy_chain(path: Path) -> list[str]:
    """The policy file and every file it extends (resolved paths), for the cache's check."""
    out: list[str] = []
    current: Path | None = path.resolve()
    while current is not None and str(current) not in out:
        out.append(str(current))
        try:
            parent = tomllib.loads(current.read_text()).get("extends")
        except (OSError, ValueError):
            break
        current = (current.parent / parent).resolve() if isinstance(parent, str) else None
    return out
