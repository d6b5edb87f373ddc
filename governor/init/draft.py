"""`governor init`: a commented starting policy for one GGUF model on one board (compile time).

The numbers come from the GGUF estimate (governor/engines/estimate.py, the same one `estimate`,
`check --engine-argv` and `launch` use) and the board's probed facts (governor/plan/host.py):

    board    = --board-memory, else MemTotal
    reserve  = [board] reserve, else 128 MiB + board / 16, at most 1 GiB   (the OS's)
    claimed  = the other slices' peak claims (none with --board-memory: an empty board)
    ceiling  = board - reserve - claimed                   (the most the engine may have)
    headroom = max(64 MiB, 10 % of the estimate)           (estimate error, the prefetch helper)
    -c       = the largest multiple of 256 whose estimate + headroom <= ceiling (or --ctx,
               refused when it does not fit)
    memory.max  = estimate + headroom       memory.high = estimate + headroom / 2
    memory.min  = the weights (their file pages, protected from reclaim by the rest of the board)

llama-server's prompt cache and [engine] caps: governor/init/server.py.

The estimate was calibrated against memory.peak in the kernel guest within 10 %
(docs/calibration.md), hence the headroom. The rendered policy is validated with the policy
model before it is returned.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from governor.board.budget import Budget, no_budget_text
from governor.board.file import board_path, no_budget_error
from governor.engines.budget import HEADROOM_MIN, HEADROOM_SHARE, estimate_argv
from governor.engines.budget import headroom_for as _headroom_for
from governor.engines.estimate import MIB, Estimate
from governor.engines.llama import (
    EngineArgs,
    EngineArgvError,
    parse_llama_argv,
)
from governor.engines.settings import KV_CELL_PAD
from governor.engines.window import CONTEXT_SHIFT, needs_shift
from governor.errors import PolicyError, UsageError
from governor.init import board as draft_board
from governor.init import learned as draft_learned
from governor.init import qos as draft_qos
from governor.init import server as draft_server
from governor.init import swap as draft_swap
from governor.init.board import Tenants
from governor.init.sizing import Sizing
from governor.kernel.parse import format_cpulist
from governor.policy.loader import load_text
from governor.policy.model import NAME_RE

if TYPE_CHECKING:
    from governor.plan.host import HostFacts

GIB = 1 << 30
DEFAULT_ENGINE = "llama-completion"  # the one-shot CLI (notes/engine.md "Which binary")
# the options init sets itself: -m from --model, -c from --ctx (or the largest that fits)
_MODEL_OPTS = frozenset({"-m", "--model"})
_CTX_OPTS = frozenset({"-c", "--ctx-size"})
_CACHE_OPTS = frozenset({"-cram", "--cache-ram"})  # llama-server: init sizes it when absent
_MLOCK_MODES = frozenset({"mlock", "mmap+mlock"})


@dataclass(frozen=True)
class Request:
    model: Path
    ctx: int | None = None
    board_memory: int | None = None
    engine_argv: tuple[str, ...] = ()
    name: str | None = None
    output: Path | None = None  # named in the policy's comments (POLICY without it)
    qos_class: str | None = None  # --class; None: interactive for a server, else background


@dataclass(frozen=True)
class Draft:
    name: str
    text: str
    engine: tuple[str, ...]  # the engine command line the policy was sized for
    sizing: Sizing
    missing: tuple[str, ...]  # controllers the policy uses that this host lacks


headroom_for = _headroom_for  # in engines/budget.py (a router model's default leaf max too)


def fit_budget(ceiling: int) -> int:
    """The largest estimate whose estimate + headroom_for(estimate) stays within ``ceiling``."""
    return max(0, min(ceiling - HEADROOM_MIN, math.floor(ceiling / (1 + HEADROOM_SHARE))))


def mib(n: int) -> int:
    return n >> 20


def _mib_up(n: int) -> int:
    return -(-n // MIB)


def policy_name(req: Request, suffix: str = ".gguf") -> str:
    """--name, checked, else the model file's name less ``suffix``, made a policy name."""
    if req.name is not None:
        if not NAME_RE.fullmatch(req.name):
            raise UsageError(
                f"not a policy name: {req.name!r} (--name)",
                hint="lower-case letters, digits, '_' and '-', starting with a letter or digit",
            )
        return req.name
    stem = req.model.name.lower().removesuffix(suffix)
    name = re.sub(r"[^a-z0-9_-]+", "-", stem).strip("-_")[:63]
    return name if NAME_RE.fullmatch(name) else "llm"


# ------------------------------------------------------------------------------ engine argv


def _split_engine(req: Request) -> tuple[str, tuple[str, ...], EngineArgs]:
    """(program, options without -m/-c, parsed options): --engine-argv is either the whole
    command line (it starts with the program) or only llama.cpp options ('-nr -ub 128')."""
    words = list(req.engine_argv)
    if "--" in words:  # llama.cpp would read no option after it: the -m and -c added below
        raise UsageError(
            "--engine-argv holds '--': the engine's options would end there (--engine-argv)",
            hint="e.g. --engine-argv '-nr -t 4'",
        )
    program = words.pop(0) if words and not words[0].startswith("-") else DEFAULT_ENGINE
    try:
        parsed = parse_llama_argv([program, *words])
    except EngineArgvError as err:
        hint = "e.g. --engine-argv '-nr -t 4'"
        raise UsageError(f"{err.reason} (--engine-argv, {err.option})", hint=hint) from err
    if parsed.model is not None and Path(parsed.model) != req.model:
        raise UsageError(
            f"--engine-argv names -m {parsed.model}, --model is {req.model} (--engine-argv, --model)",
            hint="give the model once, with --model",
        )
    if parsed.ctx is not None and req.ctx is not None and parsed.ctx != req.ctx:
        raise UsageError(
            f"--engine-argv says -c {parsed.ctx}, --ctx says {req.ctx} (--engine-argv, --ctx)",
            hint="give the context once, with --ctx",
        )
    rest: list[str] = []
    skip = False
    # an unlimited prompt cache (-1) is replaced by a sized one, like an absent --cache-ram
    sized = _MODEL_OPTS | _CTX_OPTS | (_CACHE_OPTS if (parsed.cache_ram or 0) < 0 else set())
    for word in words:
        name = word.partition("=")[0]
        if skip:
            skip = False
        elif word in sized:
            skip = True
        elif not (name in ("--model", "--ctx-size", "--cache-ram") and "=" in word) or (
            name == "--cache-ram" and "--cache-ram" not in sized
        ):
            rest.append(word)
    return program, tuple(rest), parsed


def _args(
    options: tuple[str, ...], model: Path, ctx: int, program: str = DEFAULT_ENGINE
) -> EngineArgs:
    return parse_llama_argv([program, *options, "-m", str(model), "-c", str(ctx)])


# ------------------------------------------------------------------------------ sizing


def size(  # the request, the engine and the board
    req: Request,
    options: tuple[str, ...],
    ctx: int | None,
    *,
    root: Path,
    board: int,
    source: str,
    program: str = DEFAULT_ENGINE,
    tenants: Tenants | None = None,
) -> Sizing:
    """The context and the memory values, or PolicyError (65) with the estimate's terms and
    the fixes when the model does not fit the board (at the smallest context, or at --ctx)."""
    t = tenants or Tenants()
    reserve, claimed, ceiling = t.room(board)
    none = no_budget_text(Budget.of(board, reserve))
    if none is not None:  # the board file's reserve, not the model: no model would fit
        raise no_budget_error(none, board_path())
    budget = fit_budget(ceiling)
    first = estimate_argv(
        _args(options, req.model, ctx or KV_CELL_PAD, program), root=root, budget=budget
    )
    largest = first.max_ctx
    others = f" - {claimed >> 20} MiB the other slices claim" if claimed else ""
    room = (
        f"the board leaves {budget >> 20} MiB ({board >> 20} MiB - {reserve >> 20} MiB OS reserve"
        f"{others} - headroom)"
    )
    if largest is None:
        small = (
            first
            if ctx is None
            else estimate_argv(
                _args(options, req.model, KV_CELL_PAD, program), root=root, budget=budget
            )
        )
        raise PolicyError(
            f"the model does not fit this board even at -c {KV_CELL_PAD}: llama.cpp needs"
            f" ~{_mib_up(small.total)} MiB ({_terms(small)} MiB), {room}",
            file=str(req.model),
            hint=_fixes(small, smaller_model=True),
        )
    if ctx is not None and not first.fits:
        raise PolicyError(
            f"-c {ctx} does not fit: llama.cpp needs ~{_mib_up(first.total)} MiB"
            f" ({_terms(first)} MiB), {room}; the largest -c that fits is {largest}",
            file=str(req.model),
            hint=f"--ctx {largest}, or leave --ctx out; {_fixes(first, smaller_model=False)}",
        )
    use = ctx if ctx is not None else largest
    est = (
        first
        if ctx is not None
        else estimate_argv(_args(options, req.model, use, program), root=root, budget=budget)
    )
    headroom = headroom_for(est.total)
    return Sizing(
        board=board,
        board_source=source,
        reserve=reserve,
        ceiling=ceiling,
        largest_ctx=largest,
        ctx=use,
        est=est,
        headroom=headroom,
        mem_min=_mib_up(est.term("weights")) * MIB,
        mem_high=_mib_up(est.total + headroom // 2) * MIB,
        mem_max=_mib_up(est.total + headroom) * MIB,
        claimed=claimed,
        tenants=t.lines(),
    )


def _terms(est: Estimate) -> str:
    return " + ".join(f"{t.name} {_mib_up(t.bytes)}" for t in est.terms)


def _fixes(est: Estimate, *, smaller_model: bool) -> str:
    """The estimate's own advice that changes the model or the engine (not the budget)."""
    fixes = [a for a in est.advice if a.startswith(("-nr", "-ctk", "a smaller quant"))]
    if smaller_model:
        if not any(a.startswith("a smaller quant") for a in fixes):
            fixes.append("a smaller quantisation of the model")
        fixes.append("or a smaller model")
    return "; ".join(fixes) + " (governor estimate shows the terms)"


# ------------------------------------------------------------------------------ the policy


def draft(
    req: Request,
    host: HostFacts,
    *,
    root: Path,
    tenants: Tenants | None = None,
    measured: draft_learned.Measured | None = None,
) -> Draft:
    """Size and render the policy for ``req`` on the board ``host`` describes, beside the
    ``tenants`` it already has (the other governed slices' claims, the board's reserve) and
    the peak earlier runs of its command line ``measured`` (governor/init/learned.py)."""
    name = policy_name(req)
    program, options, parsed = _split_engine(req)
    ctx = req.ctx if req.ctx is not None else parsed.ctx
    board, source = host.mem_total, f"MemTotal of {root}"
    # a policy of the same name replaces its own claim; --board-memory: an empty board
    tenants = (tenants or Tenants()).without(name)
    if req.board_memory is not None:
        board, source, tenants = req.board_memory, "--board-memory", Tenants()
    budget = fit_budget(tenants.room(board)[2])
    options, server_ctx = draft_server.server_cache(
        req.model, program, options, ctx, root=root, budget=budget
    )
    sizing = size(
        req,
        options,
        ctx if server_ctx is None else server_ctx,
        root=root,
        board=board,
        source=source,
        program=program,
        tenants=tenants,
    )
    big = host.core_types.big if host.core_types is not None else ()
    threads = len(big) if big else len(host.cpus_online)
    engine = [program, "-m", str(req.model), "-c", str(sizing.ctx), *options]
    if needs_shift(engine):  # the context is capped: a conversation slides past -c, never fails
        engine.append(CONTEXT_SHIFT)
    if parsed.threads is None:
        engine += ["-t", str(threads)]
    sizing = draft_learned.with_measured(sizing, engine, measured)
    needed = ["memory"] + (["cpuset"] if big else [])
    missing = tuple(c for c in needed if c not in host.controllers)
    qos = req.qos_class or draft_qos.default_class(sizing)
    swap, sd_card = draft_swap.read_swap(root)
    lines = draft_swap.swap_lines(swap, sd_card, qos, sizing.mem_max, host.kernel_version)
    text = render(name, req, host, sizing, (tuple(engine), options), parsed, missing, lines)

    load_text(text, source="governor init")  # a bug here is ours: PolicyError, never a bad file
    return Draft(name=name, text=text, engine=tuple(engine), sizing=sizing, missing=missing)


def _cpulist(cpus: tuple[int, ...]) -> str:

    return format_cpulist(cpus)


def _q(text: str) -> str:
    """A TOML basic string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(  # noqa: PLR0917  # one policy from all its inputs
    name: str,
    req: Request,
    host: HostFacts,
    s: Sizing,
    engine_options: tuple[tuple[str, ...], tuple[str, ...]],
    parsed: EngineArgs,
    missing: tuple[str, ...],
    swap: list[str],
) -> str:
    engine, _options = engine_options
    qos = req.qos_class or draft_qos.default_class(s)
    out = _sizing_comment(name, req, host, s, engine_options, missing)
    out += [
        f"name = {_q(name)}",
        f"description = {_q(f'{draft_server.kind(s.est)} {req.model.name} at -c {s.ctx} (governor init)')}",
        "",
        *draft_swap.memory_table(s, swap),
        *_cpu_and_process_tables(host, parsed, qos),
        *_engine_table(host, s, engine),
        *_prefetch_table(parsed),
        *draft_qos.qos_table(s, qos),
        "",
        *draft_qos.pressure(host, interactive=qos == "interactive"),
    ]
    return "\n".join(out) + "\n"


def _sizing_comment(  # noqa: PLR0917  # the head comment: how the numbers below were found
    name: str,
    req: Request,
    host: HostFacts,
    s: Sizing,
    engine_options: tuple[tuple[str, ...], tuple[str, ...]],
    missing: tuple[str, ...],
) -> list[str]:
    engine, options = engine_options
    est = s.est
    policy = shlex.quote(str(req.output)) if req.output is not None else "POLICY"
    cmd = shlex.join(engine)
    allow = f" --allow-missing {','.join(missing)}" if missing else ""
    # the estimate needs the program to know a server (its first word; options only otherwise)
    opts = shlex.join((engine[0], *options) if est.settings.server else options)
    out = [
        f"# {name}: written by `governor init` for {req.model.name} on a {mib(s.board)} MiB board"
        f" ({s.board_source}).",
        "# Check it with the engine command line it was sized for, then launch that:",
        f"#   governor check {policy}{allow} --engine-argv {shlex.quote(cmd)}",
        f"#   governor launch --policy {policy}{allow} -- {cmd}",
        "#",
        f"# llama.cpp's resident memory at -c {s.ctx} (governor estimate {req.model}"
        f" -c {s.ctx}{' --engine-argv ' + shlex.quote(opts) if opts else ''}):",
    ]
    w = max(9, 1 + max(len(t.name) for t in est.terms))
    out += [f"#   {t.name:<{w}}{t.bytes / MIB:8.1f} MiB  {t.detail}" for t in est.terms]
    out += [
        f"#   {'total':<{w}}{est.total / MIB:8.1f} MiB",
        *draft_learned.lines(s, w),
        *draft_board.board_lines(s),
        f"# headroom above the estimate: max(64 MiB, 10 %) = {s.headroom / MIB:.1f} MiB (the"
        " estimate's error against memory.peak, docs/calibration.md).",
    ]
    if host.cgroup_mount is None:
        out.append(
            f"# NOTE: this host has no cgroup2 ({host.cgroup_layout} layout): check and launch"
            " refuse here (69); governor doctor says how to mount it."
        )
    elif missing:
        out.append(
            f"# NOTE: this host lacks the {', '.join(missing)} controller(s) on cgroup2"
            f" ({host.cgroup_layout} layout): the limits they carry are NOT in force here"
            " (governor doctor says how to fix it)."
        )
    return out


def _cpu_and_process_tables(host: HostFacts, parsed: EngineArgs, qos: str) -> list[str]:
    out: list[str] = []
    if host.core_types is not None:
        ct = host.core_types
        out += [
            "[cpu]",
            f'cpus = "big"  # big cores {_cpulist(ct.big)}, LITTLE {_cpulist(ct.little)} (from'
            f" {ct.source}): a matmul split across both runs at the LITTLE cores' pace",
            "",
        ]
    # the kernel's OOM killer, if the board runs out anyway, takes the highest badness (RSS +
    # oom_score_adj/1000 of the board): a background job before the interactive engines, as
    # policies/npu-batch.toml and npu-chat.toml have it (both 500 made the larger one go: the chat)
    adj, why = (
        (800, "a background job goes first")
        if qos == "background"
        else (500, "the engine goes before its services")
    )
    out += [
        "[process]",
        f"oom_score_adj = {adj}  # if the board runs out anyway, {why}",
    ]
    if parsed.locks_memory:
        out.append('memlock = "model"  # RLIMIT_MEMLOCK for -lm mlock: model size + 64 MiB')
    return out


def _engine_table(host: HostFacts, s: Sizing, engine: tuple[str, ...]) -> list[str]:
    threads = engine[engine.index("-t") + 1] if "-t" in engine else None
    largest = (
        f"the largest -c (a multiple of {KV_CELL_PAD}) whose estimate + headroom fits"
        f" {mib(s.ceiling)} MiB"
        if s.ctx == s.largest_ctx
        else f"--ctx; the largest that fits is {s.largest_ctx}"
    )
    out = [
        "",
        "[engine]",
        'kind = "llama.cpp"',
        f"max_context_tokens = {s.ctx}  # {largest}",
    ]
    if CONTEXT_SHIFT in engine:
        out.append(
            f"# {CONTEXT_SHIFT} (on the command line): a conversation that reaches -c drops its"
            " oldest tokens and goes on (the sliding window) instead of failing"
        )
    if s.est.settings.server:
        out += draft_server.engine_lines(s.est)
    if threads is not None and threads.lstrip("-").isdigit() and int(threads) > 0:
        where = "big core" if host.core_types is not None else "online CPU"
        out.append(f"threads = {int(threads)}  # -t: one per {where}")
    return out


def _prefetch_table(parsed: EngineArgs) -> list[str]:
    out = ["", "[prefetch]"]
    if (parsed.load_mode or "") == "none" or "no_mmap" in parsed.flags:
        out.append(
            'mode = "none"  # -lm none reads the weights into anonymous memory: a page-cache'
            " prefetch would only add a second copy"
        )
    else:
        out.append(
            'mode = "populate"  # read the weights while the engine starts, charged to this'
            " slice and protected by memory.min"
        )
    return out
