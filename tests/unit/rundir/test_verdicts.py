"""A state's check is given again for the same bytes and made again for new ones (governor/
rundir/verdicts.py): a board scan at each shed firing re-read and re-checked every state.

Needs: a tmp directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fakefs.plans import make_plan

import governor.rundir.state as state_mod
from governor.rundir.state import Publisher, StateError, load_state
from governor.rundir.verdicts import Verdicts


def test_a_verdict_is_kept_per_name_and_bytes_and_the_oldest_goes_first() -> None:
    calls: list[str] = []

    def check(v: str | None) -> Callable[[], str | None]:
        def run() -> str | None:
            calls.append(str(v))
            return v

        return run

    memo = Verdicts(size=2)
    assert memo.get("a", b"x", check(None)) is None
    assert memo.get("a", b"x", check("no")) is None
    assert memo.get("b", b"x", check("other name")) == "other name"
    assert memo.get("a", b"y", check("changed")) == "changed"
    assert calls == ["None", "other name", "changed"]
    assert memo.get("a", b"x", check("again")) == "again"  # evicted


def test_an_unchanged_state_is_checked_once_and_a_changed_or_bad_one_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []
    real = state_mod.check_state

    def counting(data: object, name: str | None = None) -> str | None:
        checked.append(str(name))
        return real(data, name)

    monkeypatch.setattr(state_mod, "check_state", counting)
    monkeypatch.setattr(state_mod, "_CHECKED", Verdicts())
    plan = make_plan(policy="chat", group="governor.slice/chat").to_dict()
    pub = Publisher(tmp_path, "chat")
    pub.publish({"policy": "chat", "source": "launch", "pid": 1, "plan": plan})
    path = tmp_path / "chat" / "state.json"
    first, again = load_state(path), load_state(path)
    assert first == again and checked == ["chat"]
    pub.publish({"policy": "chat", "source": "launch", "pid": 2, "plan": plan})
    assert load_state(path).pid == 2 and checked == ["chat", "chat"]
    path.write_text(json.dumps({"policy": "other", "source": "launch", "pid": 3}))
    for _ in range(2):  # a bad state stays refused, from the kept verdict the second time
        with pytest.raises(StateError, match="published under 'chat'"):
            load_state(path)
    assert checked == ["chat", "chat", "chat"]
