"""Which launches fork a watchdog (governor/api/launch.py needs_watchdog): on_governor_exit =
"kill" for the engine's group, and under "keep" too a policy with [clocks] (the board's clocks
given back) or a `shed` rule (its victims released): the engine runs on, nothing else undoes
them should the governor die.

Needs: nothing (compiles on the rk3588 fixture tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.api import host as api_host
from governor.api.launch import needs_watchdog

RK3588 = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "rk3588"
KEEP = '[process]\non_governor_exit = "keep"\n'
SHED = '[qos]\nclass = "interactive"\n[[pressure]]\nwhen = "board memory some 100ms/1s"\ndo = ["shed"]\n'


@pytest.mark.parametrize(
    ("body", "needed"),
    [
        ("", True),  # "kill", the default
        (KEEP, False),
        (KEEP + '[clocks]\ndmc = "performance"\n', True),
        (KEEP + SHED, True),
    ],
)
def test_a_watchdog_is_forked_for_what_only_it_can_undo(
    tmp_path: Path, body: str, needed: bool
) -> None:
    policy = tmp_path / "w.toml"
    policy.write_text('name = "w"\n[memory]\nhigh = "1G"\n' + body)
    plan = api_host.check(policy, api_host.HostOptions(root=RK3588))
    assert needs_watchdog(plan) is needed
