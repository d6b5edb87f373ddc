"""Checks of an engine argv against a policy and host, before anything is applied."""

from __future__ import annotations

from governor.engines.llama import EngineArgs, EngineArgvError, parse_llama_argv
from governor.errors import PolicyError
from governor.kernel.parse import format_cpulist
from governor.plan.host import HostFacts
from governor.plan.model import Plan
from governor.policy.model import Policy


def read_engine_argv(policy: Policy, argv: tuple[str, ...]) -> EngineArgs | None:
    """Engine facts for llama.cpp policies (None for generic engines); enforces
    engine.max_context_tokens (exit 65 with the numbers)."""
    if policy.engine.kind != "llama.cpp":
        return None
    try:
        args = parse_llama_argv(argv)
    except EngineArgvError as err:
        raise PolicyError(str(err), file="engine argv", hint="check the command after --") from err
    cap = policy.engine.max_context_tokens
    if cap is not None and args.ctx is not None and (args.ctx == 0 or args.ctx > cap):
        asked = "0 (= the model's n_ctx_train)" if args.ctx == 0 else str(args.ctx)
        raise PolicyError(
            f"engine context -c {asked} exceeds engine.max_context_tokens = {cap}",
            file="engine argv",
            field="engine.max_context_tokens",
            hint=f"pass -c {cap} or less, or raise engine.max_context_tokens in the policy",
        )
    return args


def engine_warnings(args: EngineArgs | None, plan: Plan, host: HostFacts) -> list[str]:
    """Things an operator should hear about, that do not stop the launch."""
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
        types = host.core_types
        if types is not None:
            big = [c for c in cpus if c in types.big]
            little = [c for c in cpus if c in types.little]
            if big and little and threads > len(big):
                out.append(
                    f"-t {threads} spans both core types (big {format_cpulist(big)}, little"
                    f" {format_cpulist(little)}): the slow cores hold back every token;"
                    f' use -t {len(big)} or pin cpus = "big"'
                )
    if plan.launch.memlock is not None and not args.locks_memory and plan.prefetch.mode != "lock":
        out.append(
            "process.memlock is set but the engine will not lock its weights"
            ' (no --mlock / -lm mlock|mmap+mlock) and prefetch.mode is not "lock"'
        )
    return out
