"""Compile-time commands in the composition root: `schema`, `estimate`, `check
--engine-argv` and `init` (`doctor`: api/doctor.py; `check` without --engine-argv: api/check.py)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.api.admit import admission, lock_wait, npu_claims
from governor.api.board import tenants
from governor.api.check import shed_warnings
from governor.api.host import (
    HostOptions,
    check_device,
    compile_policy,
    load_policy,
    preflight_engine,
    probe_host,
)
from governor.engines.budget import estimate_argv, estimate_router, policy_budget
from governor.engines.cache_build import cache_warnings, engine_build
from governor.engines.estimate import Estimate
from governor.engines.llama import EngineArgvError, parse_llama_argv
from governor.engines.router import RouterEstimate
from governor.errors import HostError, PolicyError, UsageError
from governor.init.draft import Draft, Request, draft
from governor.init.rkllm import RkllmDraft, draft_rkllm, is_rkllm_model
from governor.init.router import RouterDraft, draft_router, is_router_model
from governor.launch.executable import which
from governor.policy.loader import load_text
from governor.policy.model import Policy
from governor.record import record
from governor.rundir.state import run_dir
from governor.state.peaks import learned, peak_key
from governor.state.store import state_dir

if TYPE_CHECKING:
    from governor.plan.host import HostFacts
    from governor.plan.model import Plan


def schema() -> dict[str, Any]:

    out = Policy.model_json_schema(by_alias=True, mode="validation")
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "governor policy"
    return out


@record(frozen=True)
class EstimateOptions:
    ctx: int | None = None  # -c (overrides the one in engine_argv)
    engine_argv: tuple[str, ...] = ()  # llama.cpp options to honour (-nr, -ctk, -ub, -lm ...)
    policy: Path | None = None  # budget = the policy's memory.max on this host
    budget: int | None = None  # budget in bytes (instead of a policy)


def estimate(
    model: Path | None, opts: HostOptions, eopts: EstimateOptions
) -> Estimate | RouterEstimate:
    """`governor estimate`: the resident-memory estimate of llama.cpp for a GGUF model, or of
    each model of llama-server's router; ``model`` None: the one the argv names (a router's
    --models-dir / --models-preset, or -m), as a service file has it (issue 43 item 15)."""

    # --engine-argv is options only, or the whole command line starting with the program
    # (llama-server: its slots and prompt cache count)
    words = list(eopts.engine_argv)
    if "--" in words:  # llama.cpp would read no option after it: -m and -c below included
        raise PolicyError(
            "--engine-argv holds '--': the engine's options would end there",
            file="--engine-argv",
            hint="give only the engine's options, e.g. --engine-argv '-nr -ub 128'",
        )
    program = words.pop(0) if words and not words[0].startswith("-") else "llama"
    argv = [program, *words]
    if model is not None:
        _no_contradiction(model, argv)
        router = model.is_dir() or model.suffix == ".ini"  # llama-server's router: per model
        if router and not program.rsplit("/", 1)[-1].startswith("llama-server"):
            argv[0] = "llama-server"
        where = "--models-dir" if model.is_dir() else "--models-preset" if router else "-m"
        argv += [where, str(model)]
    if eopts.ctx is not None:
        argv += ["-c", str(eopts.ctx)]
    try:
        args = parse_llama_argv(argv, os.environ)
    except EngineArgvError as err:
        raise PolicyError(
            err.reason, file="--engine-argv", field=err.option, hint="check the engine options"
        ) from err
    if model is None and not args.router and args.model is None:
        raise UsageError(
            "no model to estimate: give MODEL, or --engine-argv with -m FILE or llama-server's"
            " --models-dir / --models-preset (MODEL, --engine-argv)",
            hint="governor estimate model.gguf, or governor estimate --engine-argv"
            " 'llama-server --models-dir DIR -c 4096' (the argv of the service file)",
        )
    budget = eopts.budget
    if budget is None and eopts.policy is not None:
        budget = policy_budget(load_policy(eopts.policy), root=opts.root)
    if args.router:
        return estimate_router(
            args,
            root=opts.root,
            budget=budget,
            cwd=Path.cwd(),
            env=os.environ,
            budget_from="--budget" if eopts.budget is not None else "memory.max",
        )
    return with_measured(estimate_argv(args, root=opts.root, budget=budget), argv)


def with_measured(est: Estimate, argv: list[str]) -> Estimate:
    """``est`` with the peak earlier governed runs of its model and argv measured
    (governor/state/peaks.py), when there is one; a bad store is one warning."""
    got, note = learned(state_dir(), peak_key(est.model, argv))
    if note is not None:
        est = replace(est, warnings=(*est.warnings, note))
    if got is None:
        return est
    return replace(est, measured=(got.peak, got.runs))


def _no_contradiction(model: Path, argv: list[str]) -> None:
    """MODEL and an --engine-argv that names its own models contradict each other: a usage
    error (2), never one of them silently estimated (a router's argv with a GGUF MODEL was
    estimated as that one model)."""
    try:
        given = parse_llama_argv(argv, {})
    except EngineArgvError:
        return  # said below, with MODEL in place
    names = [
        (opt, value)
        for opt, value in (
            ("-m", given.model),
            ("--models-dir", given.models_dir),
            ("--models-preset", given.models_preset),
        )
        if value is not None
    ]
    if not names:
        return
    mine = (
        "--models-dir" if model.is_dir() else "--models-preset" if model.suffix == ".ini" else "-m"
    )
    if given.router and mine != "-m" and all(opt != mine for opt, _v in names):
        return  # a router's directory beside its preset: both are its models
    said = " ".join(f"{opt} {value}" for opt, value in names)
    what = "a llama-server router" if given.router else "its own model"
    raise UsageError(
        f"MODEL {model} and --engine-argv's {said} ({what}) contradict each other: give one"
        " (MODEL, --engine-argv)",
        hint=f"to estimate what the argv runs, leave MODEL out: governor estimate"
        f" --engine-argv {shlex.quote(shlex.join(argv))}",
    )


def check_engine(
    path: Path, opts: HostOptions, argv: tuple[str, ...], *, force: bool
) -> tuple[Plan, Estimate | None, list[str]]:
    """`governor check --engine-argv`: the plan plus every refusal launch makes before it
    applies anything (the same preflight); returns (plan, estimate, warnings)."""
    plan, _host, checked = preflight_engine(path, argv, opts, probe_target=True, force=force)
    check_device(plan, opts)
    admit_check(plan, opts, checked.estimate, force=force)
    return (
        plan,
        checked.estimate,
        [
            *checked.messages,
            *prompt_cache_warnings(checked.estimate, argv),
            *shed_warnings(plan, opts),
        ],
    )


def prompt_cache_warnings(est: Estimate | None, argv: tuple[str, ...]) -> list[str]:
    """llama-server's prompt cache by the engine's build (governor/engines/cache_build.py): its
    --version is run only when the argv keeps a cache (--cache-ram above 0)."""
    if est is None or not est.settings.server or est.settings.cache_ram_mib <= 0 or not argv:
        return []
    path = which(argv[0], os.environ.get("PATH")) if "/" not in argv[0] else argv[0]
    return cache_warnings(est, None if path is None else engine_build(path))


def admit_check(plan: Plan, opts: HostOptions, estimate: object, *, force: bool) -> None:
    """The board's admission as launch will ask it (governor/api/admit.py), without acting:
    75 when the guarantees (or, under admit = "refuse", the peak) do not fit now."""

    try:
        run: Path | None = run_dir()
    except HostError:
        run = None  # no run directory: nothing runs under governor here
    total = getattr(estimate, "total", None)
    admission(
        plan,
        run=run,
        root=opts.root,
        estimate=total if isinstance(total, int) else None,
        force=force,
        hold=False,
        act=False,
        lock_s=lock_wait(plan, check=True),
    )


def _device_fits(opts: HostOptions, host: HostFacts, req: Request, drafted: RkllmDraft) -> None:
    """The drafted [device] memory against this board's pool now, as `check` and `launch` weigh
    it (api/host.py check_device): a policy init writes is one check accepts. Its refusal says
    the pool's numbers; nothing is written."""
    source = str(req.output or "<init>")
    plan = compile_policy(load_text(drafted.text, source=source), host, opts, Path(source))
    check_device(plan, opts)


def init(opts: HostOptions, req: Request) -> Draft | RouterDraft | RkllmDraft:
    """`governor init`: a policy for a GGUF model on this board (governor/init/draft.py), an
    RKLLM model's (governor/init/rkllm.py)."""
    if is_rkllm_model(req.model):  # its NPU claim beside the running RKLLM instances
        host = probe_host(opts) if req.board_memory is None else None
        board = req.board_memory or (host or probe_host(opts)).mem_total
        try:
            others = npu_claims(run_dir(), opts.root) if host is not None else []
        except HostError:
            others = []  # no run directory: nothing runs under governor here
        drafted = draft_rkllm(req, board=board, others=others)
        if host is not None:  # this board now: what `check` runs on the policy
            _device_fits(opts, host, req, drafted)
        return drafted
    # --board-memory: an empty board of that size (the tenants are not read)
    beside = tenants(opts) if req.board_memory is None else None
    if is_router_model(req.model):  # llama-server's router: its models and --models-max
        return draft_router(req, probe_host(opts), root=opts.root, tenants=beside)
    return draft(
        req, probe_host(opts), root=opts.root, tenants=beside, measured=_measured_of(req.model)
    )


def _measured_of(model: Path) -> Callable[[Sequence[str]], tuple[int, int] | None]:
    """init's lookup of the peak earlier runs of an engine command line on ``model`` measured
    (governor/state/peaks.py)."""

    def lookup(engine: Sequence[str]) -> tuple[int, int] | None:
        got, _note = learned(state_dir(), peak_key(model, engine))
        return None if got is None else (got.peak, got.runs)

    return lookup
