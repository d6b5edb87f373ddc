"""What `governor init` writes for QoS (compile time): the [qos] table with an explicit
``admit`` (issue 36), the ``board available < headroom`` rule an interactive draft
(llama-server) gets, which sheds a lower class before the board is full, and the graded
[[pressure]] rules (commented out on a board without PSI)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from governor.init.sizing import Sizing
    from governor.plan.host import HostFacts


# an interactive engine's claim: what the board keeps for it before any stall (issue 36)
HEADROOM_RULE = """\
[[pressure]]                # shed before the stall: once the board can no longer give what this
when = "board available < headroom"  # engine still needs (its peak claim - memory.current), a
do = ["log", "shed"]        # lower class yields a step (throttle, freeze... its [qos] yield)
cooldown = "3s"             # at each firing while it lasts; undone once the board has room
"""


def default_class(s: Sizing) -> str:
    """The draft's class without --class: a server is interactive, a one-shot run background."""
    return "interactive" if s.est.settings.server else "background"


def qos_table(s: Sizing, qos_class: str | None = None) -> list[str]:
    """[qos] with an explicit admit (issue 36): a server answers people (interactive: it makes
    room by stopping background engines), a one-shot run can wait its turn (background);
    ``qos_class``: init's --class (issue 33), else :func:`default_class`."""
    cls = qos_class or default_class(s)
    if cls == "standard":
        return [
            "",
            "[qos]",
            'class = "standard"  # --class standard: sheds no one; a shed takes background first',
        ]
    if cls == "interactive":
        return [
            "",
            "[qos]",
            'class = "interactive"  # a server answers people: a shed takes memory from lower'
            " classes, never from it",
            'admit = "shed"  # when the board cannot take its peak beside the other engines, stop'
            " background ones to make room (docs/several.md)",
        ]
    return [
        "",
        "[qos]",
        'class = "background"  # a one-shot run: an interactive engine may shed it',
        'admit = "wait"  # when the board cannot take it beside the other engines, wait up to'
        ' admit_timeout ("60s") for room, then exit 75 (docs/several.md)',
    ]


_RULES = """\
# graded pressure rules (PSI, like policies/npu-chat.toml): one rule per severity, each firing
# runs all of its actions in order. No `signal SIGUSR1`: llama.cpp does not handle it (it dies).
[[pressure]]                # short stalls: note them and reclaim a little cold page cache
when = "memory some 150ms/2s"
do = ["log", "reclaim 64M"]
cooldown = "5s"

[[pressure]]                # the whole slice stalls: throttle earlier so reclaim starts sooner
when = "memory full 500ms/2s"
for = "4s"
do = ["log", "set memory.high -10%"]
cooldown = "15s"

[[pressure]]                # a long full stall: pause the engine so the board recovers
when = "memory full 1s/2s"
for = "6s"
do = ["freeze 5s"]
cooldown = "20s"

[[pressure]]                # it came back and still stalls: kill the group before the OOM killer
when = "memory full 1500ms/2s"
for = "15s"
do = ["log", "kill"]
cooldown = "60s"
"""


def pressure(host: HostFacts, *, interactive: bool = False) -> list[str]:
    # the headroom rule reads /proc/meminfo and memory.current: no PSI needed
    first = [*HEADROOM_RULE.splitlines(), ""] if interactive else []
    if host.psi:
        return [*first, *_RULES.splitlines()]
    return [
        *first,
        f"# no [[pressure]] rules: this board has no PSI ({host.psi_detail}); with psi=1 on the",
        "# kernel command line, uncomment these:",
        *("# " + line if line else "#" for line in _RULES.splitlines()),
    ]
