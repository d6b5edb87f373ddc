"""`governor init` for llama-server: the prompt cache it sizes and the [engine] lines it writes
(governor/init/draft.py calls these; the estimate's server terms: governor/engines/server.py).

For llama-server (``--engine-argv "llama-server ..."``) the estimate has the server's terms
(slots, the prompt cache, checkpoints). Without ``--cache-ram`` in the argv init sizes the
prompt cache too: -c is the largest whose estimate fits with room for one saved state of a
full slot in the cache, and ``--cache-ram`` gets as many full slot states as fit what is left
at that -c (at most llama-server's default); a --cache-ram given below one state is warned about
in the policy (the cache is off in effect); both go into the printed command line and the policy's caps (max_context_tokens,
max_cache_ram), so the default 8192 MiB cache, which outgrows any small board, is refused.
"""

from __future__ import annotations

from pathlib import Path

from governor.engines.budget import estimate_argv
from governor.engines.cache_build import below_one_state, slot_state_bytes
from governor.engines.estimate import MIB, Estimate
from governor.engines.llama import SERVER_CACHE_RAM_MIB, EngineArgs, parse_llama_argv
from governor.engines.settings import KV_CELL_PAD


def _args(options: tuple[str, ...], model: Path, ctx: int, program: str) -> EngineArgs:
    return parse_llama_argv([program, *options, "-m", str(model), "-c", str(ctx)])


def server_cache(
    model: Path,
    program: str,
    options: tuple[str, ...],
    ctx: int | None,
    *,
    root: Path,
    budget: int,
) -> tuple[tuple[str, ...], int | None]:
    """llama-server without --cache-ram: (options with --cache-ram N, the -c it was sized at).
    -c is --ctx, else the largest whose estimate fits with room for one saved state of a full
    slot in the prompt cache; N is what is left at that -c, at most llama-server's default.
    Options unchanged when the argv is not a server's or sets --cache-ram itself."""
    probe = _args(options, model, ctx or KV_CELL_PAD, program)
    if not probe.server or (probe.cache_ram is not None and probe.cache_ram >= 0):
        return options, ctx
    off = ("--cache-ram", "0", *options)

    def fits_with_one_state(c: int) -> bool:
        est = estimate_argv(_args(off, model, c, program), root=root, budget=budget)
        s = est.settings
        state = est.term("kv_cache") // max(1, s.kv_cells // s.slot_cells)
        return est.total + state <= budget

    use = ctx
    if use is None:
        n_ctx_train = estimate_argv(_args(off, model, 0, program), root=root, budget=None)
        lo, hi = 0, max(1, n_ctx_train.settings.ctx // KV_CELL_PAD)
        while lo < hi:  # monotone in -c
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits_with_one_state(mid * KV_CELL_PAD) else (lo, mid - 1)
        if lo == 0:
            return off, None  # nothing fits even without a cache: size() says so
        use = lo * KV_CELL_PAD
    at = estimate_argv(_args(off, model, use, program), root=root, budget=budget)
    return ("--cache-ram", str(whole_states(at)), *options), use


def whole_states(at: Estimate) -> int:
    """--cache-ram in MiB: as many full slot states as fit what is left at this -c (at most
    llama-server's default), k x one state rounded up to a MiB: a cap that is no multiple of
    the state leaves room no full conversation fits (governor/engines/cache_build.py)."""
    left = min(at.max_cache_ram or 0, SERVER_CACHE_RAM_MIB)
    state = max(1, -(-slot_state_bytes(at) // MIB))
    return (left // state) * state


def kind(est: Estimate) -> str:
    st = est.settings
    return f"llama-server --cache-ram {st.cache_ram_mib}" if st.server else "llama.cpp"


def engine_lines(est: Estimate) -> list[str]:
    """[engine] lines of a llama-server policy: the prompt cache cap and what it holds."""
    st = est.settings
    cache = st.cache_ram_mib
    state = slot_state_bytes(est) / MIB
    held = f"~{int(cache // state)} saved prompt(s) of a full slot ({state:.1f} MiB each)"
    shared = "one unified KV buffer" if st.kv_unified or st.slots == 1 else "KV split per slot"
    return [
        f"max_cache_ram = {cache}  # MiB, llama-server --cache-ram: {held}; its default"
        f" {SERVER_CACHE_RAM_MIB} MiB grows with every new conversation past the board",
        f"# slots: -np {st.slots} ({shared}, {st.slot_cells} tokens each); checkpoints"
        f" {est.term('checkpoints') / MIB:.1f} MiB",
        *(f"# WARNING: {w}" for w in [below_one_state(est)] if w is not None),
    ]
