"""`governor init` for llama-server's router (--model is a models directory or a preset .ini):
each model estimated as the router's child runs it (governor/engines/router.py), then

    models   = how many fit the board's ceiling together, largest first (governor init's
               ceiling and headroom, governor/init/draft.py), at most the --models-max given
    memory.max  = the chosen largest estimates + headroom     memory.high = + headroom / 2

and the router command line with that --models-max, so `check --engine-argv` accepts it.
No memory.min: models load and unload, no page stays resident for long.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from governor.engines.budget import estimate_router, headroom_for
from governor.engines.estimate import MIB
from governor.engines.llama import EngineArgvError, parse_llama_argv
from governor.engines.router import RouterEstimate, fits_together
from governor.errors import PolicyError, UsageError
from governor.init.board import Tenants
from governor.init.draft import (
    Request,
    _mib_up,
    _q,
    fit_budget,
    policy_name,
)
from governor.init.qos import _RULES
from governor.policy.loader import load_text

if TYPE_CHECKING:
    from governor.plan.host import HostFacts

SERVER = "llama-server"
_ROUTER_OPTS = frozenset({"--models-max", "--models-dir", "--models-preset"})


def is_router_model(model: Path) -> bool:
    """--model names llama-server's router's models: a directory or a preset file."""
    return model.is_dir() or model.suffix == ".ini"


@dataclass(frozen=True)
class RouterSizing:
    board: int
    board_source: str
    ceiling: int
    router: RouterEstimate
    models_max: int  # what the router command line says
    chosen: int  # the estimates of the models_max largest
    headroom: int
    mem_high: int
    mem_max: int
    tenants: tuple[str, ...] = ()  # the board's other claims it was sized beside


@dataclass(frozen=True)
class RouterDraft:
    name: str
    text: str
    engine: tuple[str, ...]
    sizing: RouterSizing
    missing: tuple[str, ...]


def draft_router(
    req: Request, host: HostFacts, *, root: Path, tenants: Tenants | None = None
) -> RouterDraft:
    """Size and render the policy for a router whose models ``req.model`` names, beside the
    ``tenants`` the board already has (the other governed slices' claims, its reserve)."""
    name = policy_name(req)
    words = list(req.engine_argv)
    program = words.pop(0) if words and not words[0].startswith("-") else SERVER
    where = "--models-dir" if req.model.is_dir() else "--models-preset"
    options = _without(words, _ROUTER_OPTS | ({"-c", "--ctx-size"} if req.ctx else set()))
    ctx = ["-c", str(req.ctx)] if req.ctx else []
    try:
        given = parse_llama_argv([program, *words]).models_max
        args = parse_llama_argv([program, *options, *ctx, where, str(req.model)])
    except EngineArgvError as err:
        raise UsageError(f"{err.reason} (--engine-argv, {err.option})") from err
    rest = estimate_router(args, root=root, budget=None, cwd=Path.cwd())
    if not rest.models:
        raise PolicyError(f"no model found in {req.model}", file="--model", hint="put GGUFs there")
    board, source = (
        (req.board_memory, "--board-memory")
        if req.board_memory is not None
        else (host.mem_total, f"MemTotal of {root}")
    )
    # a policy of the same name replaces its own claim; --board-memory: an empty board
    beside = Tenants() if req.board_memory is not None else (tenants or Tenants()).without(name)
    ceiling = beside.room(board)[2] // MIB * MIB
    totals = sorted((e.total for _m, e in rest.models), reverse=True)
    cap = len(totals) if not given else min(given, len(totals))
    # the router's own memory counts beside its models (plan/router.py: one figure)
    n = min(cap, fits_together(totals, fit_budget(ceiling) - rest.own))
    if n == 0:
        raise PolicyError(
            f"no model of {req.model} fits this board alone: the largest needs"
            f" ~{totals[0] >> 20} MiB + the router's own {rest.own >> 20} MiB + headroom, the"
            f" board can give {ceiling >> 20} MiB",
            file="--model",
            hint="a smaller -c or --cache-ram in --engine-argv, or a larger --board-memory",
        )
    chosen = rest.own + sum(totals[:n])
    headroom = headroom_for(chosen)
    sizing = RouterSizing(
        board=board, board_source=source, ceiling=ceiling, router=rest, models_max=n,
        tenants=beside.lines(),
        chosen=chosen, headroom=headroom, mem_high=_mib_up(chosen + headroom // 2) * MIB,
        mem_max=_mib_up(chosen + headroom) * MIB,
    )  # fmt: skip
    engine = (program, where, str(req.model), *options, *ctx, "--models-max", str(n))
    missing = tuple(c for c in ("memory",) if c not in host.controllers)
    text = _render(name, req, host, sizing, engine)
    load_text(text, source="governor init")
    return RouterDraft(name=name, text=text, engine=engine, sizing=sizing, missing=missing)


def _without(words: list[str], drop: frozenset[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in drop:
            skip = True
        elif word.partition("=")[0] not in drop:
            out.append(word)
    return out


def _render(
    name: str, req: Request, host: HostFacts, s: RouterSizing, engine: tuple[str, ...]
) -> str:
    policy = str(req.output) if req.output is not None else "POLICY"
    rows = sorted(s.router.models, key=lambda me: me[1].total, reverse=True)
    out = [
        f"# governor init: llama-server's router over {req.model} ({len(rows)} models)",
        f"# board {s.board >> 20} MiB ({s.board_source}), ceiling {s.ceiling >> 20} MiB",
        *(f"#   beside {line}" for line in s.tenants),
        *(
            f"#   {m.alias}: estimate {e.total / MIB:.1f} MiB at -c {e.settings.ctx}"
            for m, e in rows
        ),
        f"# --models-max {s.models_max}: the {s.models_max} largest fit together"
        f" ({s.chosen / MIB:.1f} MiB with the router's own {s.router.own / MIB:.1f} MiB"
        f" + headroom {s.headroom / MIB:.1f} MiB)",
        "# run it:",
        f"#   governor launch --policy {shlex.quote(policy)} -- {shlex.join(engine)}",
        f"name = {_q(name)}",
        f"description = {_q(f'llama-server router over {req.model.name} (governor init)')}",
        "",
        "[memory]",
        f'high = "{s.mem_high >> 20}MiB"  # the chosen models + half the headroom',
        f'max = "{s.mem_max >> 20}MiB"  # the {s.models_max} largest models + headroom',
        'swap_max = "0"',
        "",
        "[engine]",
        'kind = "llama.cpp"',
        "",
        *(_RULES.splitlines() if host.psi else []),
    ]
    return "\n".join(out) + "\n"
