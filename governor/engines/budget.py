"""Glue between the pure GGUF estimate and the host: read the model's header, pick the CPU's
repack family, resolve a policy's memory.max as the budget.

The refusal itself (an estimate above memory.max is 65 unless --force) is made by the one
preflight of `governor launch` and `governor check --engine-argv` (governor/engines/preflight.py).
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from governor.engines.engine_files import engine_file_bytes
from governor.engines.estimate import Estimate, cpu_family, estimate
from governor.engines.gguf import read_gguf_cached as read_gguf
from governor.engines.llama import EngineArgs, EngineArgvError, model_parts, parse_llama_argv
from governor.engines.projector import read_projector
from governor.engines.router import (
    MODELS_MAX,
    PresetError,
    RouterEstimate,
    name_warnings,
    read_preset,
    router_models,
    shown,
)
from governor.engines.settings import settings_from_argv
from governor.errors import PolicyError, PolicyNotFound
from governor.kernel.files import MEMORY_MAX
from governor.kernel.parse import cpuinfo_machine
from governor.kernel.procfs import ProcFs
from governor.peer.files import CappedReadError

if TYPE_CHECKING:
    from governor.plan.model import Plan
    from governor.policy.model import Policy

MIB = 1 << 20
HEADROOM_MIN = 64 * MIB  # the prefetch helper and the engine's heap spread (~4 MiB per run)
HEADROOM_SHARE = 0.10  # the estimate's error against memory.peak (docs/calibration.md)


def headroom_for(total: int) -> int:
    """governor init's headroom over an estimate (governor/init/draft.py), also a router
    model's default leaf max."""
    return max(HEADROOM_MIN, math.ceil(total * HEADROOM_SHARE))


def host_family(root: Path) -> str:
    """The repack family of this host's CPU (x86-avx2, arm-dotprod, ...)."""
    text = ProcFs(root / "proc").cpuinfo()
    return cpu_family(cpuinfo_machine(text, platform.machine()), text)


def estimate_argv(args: EngineArgs, *, root: Path, budget: int | None) -> Estimate:
    """Read the model's header (all parts of a split GGUF) and estimate the argv."""
    assert args.model is not None
    parts = model_parts(args.model)
    info = read_gguf(parts[0])
    if len(parts) > 1:  # tensors of the other parts: their sizes add to the weights
        extra = tuple(t for p in parts[1:] for t in read_gguf(p).tensors)
        info = replace(info, tensors=info.tensors + extra)
    settings = settings_from_argv(args, info.n_ctx_train)
    if args.argv:
        found = engine_file_bytes(args.argv[0], root=root)
        settings = replace(settings, engine_files=found)
    if args.mmproj is not None:
        proj = read_projector(Path(args.mmproj), image_max_tokens=args.image_max_tokens)
        offload = "no_mmproj_offload" not in args.flags
        settings = replace(settings, projector=replace(proj, offload=offload))
    return estimate(
        info,
        settings,
        family=host_family(root),
        budget=budget,
        unsized=args.unsized,
    )


def policy_budget(policy: Policy, *, root: Path) -> int | None:
    """The policy's memory.max in bytes on the host under ``root`` (percentages of MemTotal);
    None when it has none, or when it is given relative to the model ("model")."""
    size = policy.memory.max
    if size is None or size.kind == "model":
        return None
    try:
        mem_total = ProcFs(root / "proc").meminfo().get("MemTotal", 0)
    except (OSError, ValueError):
        mem_total = 0
    return size.resolve(mem_total)


def estimate_router(
    args: EngineArgs,
    *,
    root: Path,
    budget: int | None,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    budget_from: str = "memory.max",
) -> RouterEstimate:
    """Every model a llama-server router may load, estimated with the argv the router gives its
    child (governor/engines/router.py); 66 for a models directory or preset that is missing,
    65 for a preset or a model's options that cannot be read."""
    preset_text = None
    if args.models_preset is not None:
        preset = Path(args.models_preset)
        preset = preset if preset.is_absolute() else cwd / preset
        try:
            preset_text = read_preset(preset)
        except CappedReadError as err:  # not UTF-8, a FIFO, a device, over its cap: 65
            raise PolicyError(
                str(err),
                field="--models-preset",
                hint="a preset is a small UTF-8 INI file of [sections] of 'key = value' lines"
                " (llama-server's README)",
            ) from None
        except OSError as err:
            raise PolicyNotFound(
                f"models preset not readable: {preset} ({err.strerror})",
                file="engine argv",
                field="--models-preset",
                hint="check the path after --models-preset",
            ) from err
    try:
        models, unsized = router_models(args, preset_text=preset_text, cwd=cwd)
    except PresetError as err:
        raise PolicyError(
            err.reason,
            file=str(args.models_preset),
            field=f"line {err.line}",
            hint="a preset holds [sections] of 'key = value' lines (llama-server's README)",
        ) from err
    except OSError as err:
        raise PolicyNotFound(
            f"models directory not readable: {args.models_dir} ({err.strerror})",
            file="engine argv",
            field="--models-dir",
            hint="check the path after --models-dir",
        ) from err
    estimates = []
    for model in models:
        try:
            child = parse_llama_argv(model.argv, env)
        except EngineArgvError as err:
            raise PolicyError(
                f"model {model.alias}: {err.reason}",
                file="engine argv",
                field=err.option,
                hint="check the router's options and the preset's keys for this model",
            ) from err
        estimates.append((model, estimate_argv(child, root=root, budget=budget)))
    return RouterEstimate(
        models=tuple(estimates),
        models_max=MODELS_MAX if args.models_max is None else args.models_max,
        budget=budget,
        budget_from=budget_from,
        unsized=tuple(unsized),
    )


def fit_router(
    args: EngineArgs,
    evict: str,
    memory_max: int | None,
    *,
    root: Path,
    cwd: Path,
) -> tuple[RouterEstimate, list[tuple[str, str]]]:
    """The budget of llama-server's router: its --models-max largest models (each estimated
    as the router runs it) against memory.max. The router's eviction counts models, not bytes
    (it loads --models-max of them whatever they weigh), so a --models-max under which the
    largest cannot fit is refused (65) naming the count that fits, unless the policy says
    ``[engine] evict = "memory"``."""
    rest = estimate_router(args, root=root, budget=memory_max, cwd=cwd)
    warnings: list[tuple[str, str]] = [
        ("estimate.unsized", f"router model {name}: no local model file, not sized")
        for name in rest.unsized
    ]
    if rest.fits or memory_max is None:
        return rest, warnings
    together = rest.together or 0
    given = args.models_max
    said = (
        f"--models-max {rest.models_max} (llama-server's default)"
        if given is None
        else "--models-max 0 (no limit)"
        if given == 0
        else f"--models-max {given}"
    )
    numbers = (
        f"{said} lets llama-server load {rest.loadable} of its {len(rest.models)} models at"
        f" once: the {rest.loadable} largest need ~{rest.largest_bytes >> 20} MiB with the"
        f" router's own {rest.own >> 20} MiB"
        f" ({rest.largest_bytes} bytes), above memory.max {memory_max >> 20} MiB"
        f" ({memory_max} bytes); {together} fit together"
    )
    if evict == "memory":
        warnings.append(("router.overcommit", f"{numbers}; engine.evict = memory"))
        return rest, warnings
    largest = max(rest.models, key=lambda me: me[1].total)
    raise PolicyError(
        numbers,
        file="engine argv",
        field="--models-max",
        hint=(
            f'pass --models-max {together}, or set [engine] evict = "memory" in the policy'
            if together
            else f"no model fits alone (the largest, {largest[0].alias}, needs"
            f" ~{largest[1].total >> 20} MiB): raise memory.max or shrink its -c / --cache-ram"
        )
        + " (governor estimate shows each model)",
    )


class _Checked(Protocol):
    """What :func:`with_router` adds to: a preflight (governor/engines/preflight.py)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def warnings(self) -> tuple[tuple[str, str], ...]: ...


C = TypeVar("C", bound=_Checked)


def with_router(checked: C, plan: Plan, args: EngineArgs, *, root: Path, cwd: Path) -> C:
    """The preflight of a llama-server router (:func:`fit_router` against the plan's
    memory.max), with each model's estimate and its leaf's default max (the estimate + init's
    headroom) for the launch: {"router": {alias: bytes}, "router_max": {alias: bytes}}."""
    rest, said = fit_router(args, plan.engine.evict, plan.limit(MEMORY_MAX), root=root, cwd=cwd)
    said += [("router.name", w) for w in name_warnings(rest)]
    listed = {m.alias for m, _e in rest.models} | set(rest.unsized)
    for spec in plan.engine.models:
        if spec.alias not in listed:
            names = ", ".join(shown(a) for a in sorted(listed)[:8]) + (
                ", ..." if len(listed) > 8 else ""
            )
            said.append(
                (
                    "router.unlisted",
                    f"[engine.models.{json.dumps(spec.alias)}] limits nothing: the router lists"
                    f" no model {spec.alias!r} (its models: {names or 'none'})",
                )
            )
    totals = {m.alias: e.total for m, e in rest.models}
    router = {
        "router": totals,
        "router_max": {a: t + headroom_for(t) for a, t in totals.items()},
    }
    return replace(checked, warnings=(*checked.warnings, *said), router=router)


def router_keys_unused(plan: Plan, args: EngineArgs | None) -> list[tuple[str, str]]:
    """The router's keys (``evict = "memory"``, ``[engine.models]``) on an engine that is no
    router: they do nothing, said once each as (event, warning)."""
    if args is not None and args.router:
        return []
    why = (
        "the engine is no llama-server router (--models-dir / --models-preset and no -m of its own)"
    )
    out: list[tuple[str, str]] = []
    if plan.engine.evict == "memory":
        out.append(("engine.evict", f'engine.evict = "memory" unloads nothing: {why}'))
    if plan.engine.models:
        out.append(("engine.models", f"[engine.models] limits nothing: {why}"))
    return out
