"""`governor init` beside the board's tenants (issue 36): the other governed slices' claims
and the board file's reserve it sizes against, and the comment lines that say so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from governor.board.budget import reserve_for
from governor.board.slice import Slice

if TYPE_CHECKING:
    from governor.init.sizing import Sizing


def mib(n: int) -> int:
    return n >> 20


@dataclass(frozen=True)
class Tenants:
    """What the board already holds (governor/board/scan.py gathers it): the other governed
    slices' claims and the board file's ``[board] reserve`` (None: the default)."""

    claims: tuple[Slice, ...] = ()
    reserve: int | None = None

    def without(self, name: str) -> Tenants:
        return Tenants(tuple(c for c in self.claims if c.name != name), self.reserve)

    def room(self, board: int) -> tuple[int, int, int]:
        """(reserve, the claims' peaks, what is left: whole MiB, the values are in MiB)."""
        reserve = reserve_for(board) if self.reserve is None else self.reserve
        claimed = sum(c.peak_claim for c in self.claims)
        return reserve, claimed, max(0, board - reserve - claimed) >> 20 << 20

    def lines(self) -> tuple[str, ...]:
        ordered = sorted(self.claims, key=lambda c: (-c.peak_claim, c.name))
        return tuple(f"{c.name} {mib(c.peak_claim)} MiB ({c.state})" for c in ordered)


def board_lines(s: Sizing) -> list[str]:
    """How much of the board is this engine's: the reserve, and the other slices' claims."""
    reserve = (
        f"OS reserve {mib(s.reserve)} MiB"
        if s.reserve != reserve_for(s.board)
        else f"OS reserve {mib(s.reserve)} MiB (128 MiB + 1/16 of the board, at most 1 GiB)"
    )
    if not s.tenants:
        return [f"# board {mib(s.board)} MiB - {reserve} = {mib(s.ceiling)} MiB for the engine;"]
    return [
        f"# board {mib(s.board)} MiB - {reserve} - {mib(s.claimed)} MiB the other slices claim"
        f" at peak = {mib(s.ceiling)} MiB for the engine",
        f"# (sized beside them: {'; '.join(s.tenants)}; `governor board` lists them,"
        " --board-memory sizes for an empty board);",
    ]
