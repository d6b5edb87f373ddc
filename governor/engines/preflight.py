"""One preflight: every refusal `governor launch` makes before it applies anything, in one place
and one order, so that `governor check POLICY --engine-argv '...'` refuses exactly what launch
refuses, with the same exit code and message.

The order (the first refusal wins):

1. :func:`engine_args`: the engine argv is readable and within engine.max_context_tokens (65);
2. :func:`model_bytes`: every part of the model (-m) exists (66); its size goes into the compile
   (memory.min / process.memlock = "model");
3. the caller compiles the plan (69 / 65), then :func:`preflight`:

   a. process.memlock = "model" was resolved by the model's size (65);
   b. the prefetch files: resolved (65 for "auto" without a llama.cpp -m), present (66),
      readable (77), regular files (65);
   c. ONE budget fit against memory.max (65): the GGUF estimate (weights + repack + KV cache +
      compute) of a GGUF (--force: a warning), else the model's file size (+ KV cache when
      known); llama-server's router: its --models-max largest models (budget.with_router);
   d. the prefetch against memory.max (65): page cache is charged to the slice (cgroup-v2.rst,
      "Memory Ownership"), so populating more than memory.max reclaims the first pages to make
      room for the last (it would evict itself), and locked pages cannot be reclaimed at all;
   e. warnings: above memory.high, the engine argv (threads, context), a forced estimate.

Budget refusals are PolicyError (exit 65, EX_DATAERR): the policy's own budget contradicts the
workload it is launched with, which the operator fixes in the policy or the argv; 69
(EX_UNAVAILABLE) is kept for a host that lacks a capability.

Warnings come back as data, ``(event, message)`` pairs, for the caller to print (check) or log
(launch); no pydantic, typer or logging framework here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from governor.engines.budget import estimate_argv, router_keys_unused, with_router
from governor.engines.llama import (
    EngineArgs,
    EngineArgvError,
    address_warnings,
    is_gguf,
    model_parts,
    parse_llama_argv,
    slot_warnings,
)
from governor.engines.prefetch_files import check_readable, resolve_files
from governor.engines.window import no_shift_warning
from governor.errors import HostError, PolicyError, PolicyNotFound
from governor.kernel import files as kf
from governor.kernel.parse import format_cpulist
from governor.policy.values import human_bytes

if TYPE_CHECKING:
    from governor.engines.estimate import Estimate
    from governor.plan.host import HostFacts
    from governor.plan.model import Plan

Said = tuple[str, str]  # (event, message): a constant dotted event name and the text


@dataclass(frozen=True)
class Preflight:
    """What launch needs from the checks: the GGUF estimate (None when the model is not a GGUF
    or the estimate is unavailable), the prefetch files in order and their total size, the
    warnings to say and notes for the debug log."""

    estimate: Estimate | None
    files: tuple[str, ...]
    prefetch_bytes: int
    warnings: tuple[Said, ...] = ()
    notes: tuple[str, ...] = ()
    args: EngineArgs | None = None  # the engine argv it checked (engine_args), for the caller
    router: dict[str, Any] | None = None  # llama-server's router: engines/budget.py with_router

    @property
    def messages(self) -> list[str]:
        return [message for _event, message in self.warnings]


# ------------------------------------------------------------------------------ the engine argv


def engine_args(
    kind: str,
    max_context_tokens: int | None,
    argv: Sequence[str],
    *,
    max_cache_ram: int | None = None,
    env: Mapping[str, str] | None = None,
) -> EngineArgs | None:
    """Engine facts of a llama.cpp argv (None for a generic engine); refuses an argv it cannot
    read or a context above ``max_context_tokens`` (65, with the numbers), and a llama-server
    prompt cache above ``max_cache_ram`` MiB (its default 8192 and -1 = no limit included).
    ``kind`` and the caps come from the policy's or the compiled plan's [engine]; ``env`` is
    the engine's environment (llama.cpp reads LLAMA_ARG_* from it)."""
    if kind != "llama.cpp":
        return None
    try:
        args = parse_llama_argv(tuple(argv), env)
    except EngineArgvError as err:
        raise PolicyError(
            err.reason, file="engine argv", field=err.option, hint="check the command after --"
        ) from err
    cap = max_context_tokens
    if cap is not None and args.ctx is not None and (args.ctx == 0 or args.ctx > cap):
        asked = "0 (= the model's n_ctx_train)" if args.ctx == 0 else str(args.ctx)
        raise PolicyError(
            f"engine context -c {asked} exceeds engine.max_context_tokens = {cap}",
            file="engine argv",
            field="engine.max_context_tokens",
            hint=f"pass -c {cap} or less, or raise engine.max_context_tokens in the policy",
        )
    if args.server and max_cache_ram is not None:
        _check_cache_ram(args, max_cache_ram)
    return args


def _check_cache_ram(args: EngineArgs, cap: int) -> None:
    asked = args.server_cache_ram_mib  # absent: llama-server's default
    if 0 <= asked <= cap:
        return
    said = (
        f"no --cache-ram (llama-server's default {asked} MiB)"
        if args.cache_ram is None
        else "--cache-ram -1 (no limit)"
        if asked < 0
        else f"--cache-ram {asked}"
    )
    raise PolicyError(
        f"engine prompt cache: {said} exceeds engine.max_cache_ram = {cap} MiB",
        file="engine argv",
        field="engine.max_cache_ram",
        hint=f"pass --cache-ram {cap} or less (0 turns the prompt cache off),"
        " or raise engine.max_cache_ram in the policy",
    )


def model_bytes(args: EngineArgs | None) -> int | None:
    """Size of the engine's model file(s) (all parts of a split GGUF); 66 when one is missing."""
    if args is None or args.model is None:
        return None
    total = 0
    for part in model_parts(args.model):
        try:
            total += part.stat().st_size
        except OSError as err:
            raise PolicyNotFound(
                f"model file not found: {part} ({err.strerror})",
                file="engine argv",
                field="-m/--model",
                hint="check the model path after -m",
            ) from err
    return total


def engine_warnings(args: EngineArgs | None, plan: Plan, host: HostFacts | None) -> list[str]:
    """Things an operator should hear about, that do not stop the launch (``host`` gives the
    core types for the big.LITTLE warning; without it that one is skipped)."""
    if args is None:
        return []
    out: list[str] = []
    cap = plan.engine.max_context_tokens
    if args.ctx is None:
        out.append(
            "no -c/--ctx-size: llama.cpp then takes n_ctx_train from the GGUF"
            " (e.g. 32768 -> ~6 GiB of KV cache on a 1.8B model)"
            + (f"; pass -c {cap}" if cap else "; pass -c explicitly")
        )
    cpus = plan.launch.affinity
    threads = args.threads
    if threads is not None and threads > 0 and cpus:
        if threads > len(cpus):
            out.append(
                f"-t {threads} exceeds the {len(cpus)} pinned CPUs ({format_cpulist(cpus)});"
                f" use -t {len(cpus)}"
            )
        types = host.core_types if host is not None else None
        if types is not None:
            big = [c for c in cpus if c in types.big]
            little = [c for c in cpus if c in types.little]
            if big and little and threads > len(big):
                out.append(
                    f"-t {threads} spans both core types (big {format_cpulist(big)}, little"
                    f" {format_cpulist(little)}): the slow cores hold back every token;"
                    f' use -t {len(big)} or pin cpus = "big"'
                )
    shift = no_shift_warning(args.argv, cap, plan.qos.qos_class)
    if shift is not None:
        out.append(shift)
    if plan.launch.memlock is not None and not args.locks_memory and plan.prefetch.mode != "lock":
        out.append(
            "process.memlock is set but the engine will not lock its weights"
            ' (no --mlock / -lm mlock|mmap+mlock) and prefetch.mode is not "lock"'
        )
    return out


# ------------------------------------------------------------------------------ the budget (pure)


def fit_model_size(
    *,
    model_bytes: int | None,
    memory_max: int | None,
    memory_high: int | None,
    kv_bytes: int | None = None,
    source: str | None = None,
) -> tuple[list[Said], list[str]]:
    """The budget without a GGUF estimate: the model's file size (+ KV cache when known)
    against memory.max (65) and memory.high (a warning). Returns (warnings, notes)."""
    warnings: list[Said] = []
    notes: list[str] = []
    if model_bytes is None:
        return warnings, notes
    need = model_bytes + (kv_bytes or 0)
    what = f"model {human_bytes(model_bytes)}"
    if kv_bytes is not None:
        what += f" + KV cache {human_bytes(kv_bytes)}"
    else:
        notes.append("budget checked with the model file size only (KV cache size unknown)")
    if memory_max is not None and need > memory_max:
        raise PolicyError(
            f"{what} = {human_bytes(need)} ({need} bytes) does not fit memory.max"
            f" {human_bytes(memory_max)} ({memory_max} bytes)",
            file=source,
            field="memory.max",
            hint="raise memory.max, use a smaller model (quantisation) or a shorter context",
        )
    if memory_high is not None and need > memory_high:
        warnings.append(
            (
                "budget.above_high",
                f"{what} = {human_bytes(need)} is above memory.high {human_bytes(memory_high)}:"
                " the engine will be throttled",
            )
        )
    return warnings, notes


def fit_prefetch(
    *,
    mode: str,
    prefetch_bytes: int,
    memory_max: int | None,
    memory_high: int | None,
    source: str | None = None,
) -> list[Said]:
    """The prefetch against memory.max: populate or lock of more than it is refused (65);
    advise of more than it, or any prefetch above memory.high, is a warning."""
    if mode == "none":
        return []
    size, limit = human_bytes(prefetch_bytes), human_bytes(memory_max or 0)
    if memory_max is not None and prefetch_bytes > memory_max:
        numbers = f"{size} ({prefetch_bytes} bytes), above memory.max {limit} ({memory_max} bytes)"
        if mode == "lock":
            raise PolicyError(
                f"prefetch.mode = lock would lock {numbers}",
                file=source,
                field="prefetch.mode",
                hint="locked pages cannot be reclaimed: raise memory.max or prefetch fewer files",
            )
        if mode == "populate":
            raise PolicyError(
                f"prefetch.mode = populate would fault in {numbers}: it would evict itself",
                file=source,
                field="prefetch.mode",
                hint="the slice reclaims the first pages to make room for the last: raise"
                ' memory.max, prefetch fewer files or use mode = "advise"',
            )
        return [
            (
                "prefetch.budget",
                f"prefetch of {size} is above memory.max {limit}: read-ahead will evict its own"
                " pages",
            )
        ]
    if memory_high is not None and prefetch_bytes > memory_high:
        return [
            (
                "prefetch.budget",
                f"prefetch of {size} crosses memory.high {human_bytes(memory_high)}: it will"
                " throttle and reclaim itself",
            )
        ]
    return []


# ------------------------------------------------------------------------------ the GGUF estimate


def fit_estimate(
    args: EngineArgs,
    *,
    memory_max: int | None,
    memory_high: int | None,
    root: Path,
    force: bool,
    source: str | None,
) -> tuple[Estimate | None, list[Said], list[str]]:
    """The budget of a GGUF model: llama.cpp's estimated resident memory against memory.max
    (65 unless ``force``). (None, ...) when the optional `gguf` package is missing: the caller
    falls back to the file size."""

    try:
        est = estimate_argv(args, root=root, budget=memory_max)
    except HostError as err:
        if "gguf" not in err.missing:
            raise
        message = f"{err}; {err.hint}" if err.hint else str(err)
        return None, [("estimate.unavailable", message)], []
    notes = [
        f"estimate {est.total} bytes against memory.max {memory_max}, largest -c {est.max_ctx}"
    ]
    warnings: list[Said] = []
    if memory_high is not None and est.total > memory_high:
        warnings.append(
            (
                "estimate.above_high",
                f"estimated {est.total >> 20} MiB is above memory.high {memory_high >> 20} MiB:"
                " the engine will be throttled and its file pages reclaimed",
            )
        )
    if est.fits:
        return est, warnings, notes
    assert memory_max is not None  # no budget always fits
    terms = " + ".join(f"{t.name} {t.bytes >> 20}" for t in est.terms)
    numbers = (
        f"llama.cpp will need ~{est.total >> 20} MiB ({terms} MiB; {est.total} bytes), above"
        f" memory.max {memory_max >> 20} MiB ({memory_max} bytes)"
    )
    if force:
        warnings.append(("estimate.forced", f"{numbers}; launching anyway (--force)"))
        return est, warnings, notes
    raise PolicyError(
        numbers,
        file=source,
        field="memory.max",
        hint=f"{'; '.join(est.advice)}; or pass --force to launch anyway"
        " (governor estimate shows the terms)",
    )


# -------------------------------------------------------------------------------- the preflight


def preflight(
    plan: Plan,
    args: EngineArgs | None,
    *,
    root: Path,
    cwd: Path,
    force: bool,
    host: HostFacts | None = None,
) -> Preflight:
    """Every refusal before apply that needs the compiled plan, in the module's order.

    ``args`` come from :func:`engine_args` (None for a generic engine) and the plan was compiled
    with :func:`model_bytes` of them; ``root`` is the probed filesystem root (the CPU for the
    estimate's repack term), ``cwd`` anchors relative prefetch paths, ``force`` lets a GGUF
    estimate above memory.max through with a warning."""
    source = plan.source
    if plan.launch.memlock == "model":
        raise PolicyError(
            'process.memlock = "model" needs the engine\'s model file',
            file=source,
            field="process.memlock",
            hint="pass the model with -m, or give memlock as a size",
        )
    mode = plan.prefetch.mode
    paths: list[Path] = []
    if mode != "none":
        paths = resolve_files(
            plan.prefetch.files,
            model=args.model if args is not None else None,
            engine_kind=plan.engine.kind,
            cwd=cwd,
            source=source,
        )
    prefetch_bytes = sum(check_readable(p, source=source) for p in paths)

    memory_max, memory_high = plan.limit(kf.MEMORY_MAX), plan.limit(kf.MEMORY_HIGH)
    warnings: list[Said] = [("engine.argv", w) for w in engine_warnings(args, plan, host)]
    warnings += router_keys_unused(plan, args)
    notes: list[str] = []
    est = None
    if args is not None and is_gguf(args):
        est, more, notes = fit_estimate(
            args,
            memory_max=memory_max,
            memory_high=memory_high,
            root=root,
            force=force,
            source=source,
        )
        warnings += more
    if est is None:
        size = model_bytes(args)
        more, notes = fit_model_size(
            model_bytes=size, memory_max=memory_max, memory_high=memory_high, source=source
        )
        # a prefetch of the model that crosses memory.high says it once, below
        if not (mode != "none" and memory_high is not None and prefetch_bytes > memory_high):
            warnings += more
    warnings += fit_prefetch(
        mode=mode,
        prefetch_bytes=prefetch_bytes,
        memory_max=memory_max,
        memory_high=memory_high,
        source=source,
    )
    checked = Preflight(
        estimate=est,
        files=tuple(str(p) for p in paths),
        prefetch_bytes=prefetch_bytes,
        warnings=(
            *warnings,
            *address_warnings(args, evict=plan.engine.evict == "memory"),
            *slot_warnings(args, evict=plan.engine.evict == "memory"),
        ),
        notes=tuple(notes),
        args=args,
    )
    return with_router(checked, plan, args, root=root, cwd=cwd) if args and args.router else checked
