"""The launcher's signal forwarder: what it does with a stop signal before, while and after the
engine runs (launch/launcher.py Forwarder)."""

from __future__ import annotations

import signal
import subprocess

from governor.launch.forward import Forwarder
from governor.log import capture_logs


def test_a_held_signal_reaches_the_engine_once_it_runs_and_not_before() -> None:
    told: list[int] = []
    fwd = Forwarder(hold=True)
    fwd(signal.SIGTERM, None)  # the apply is done, the engine not started yet
    assert fwd.held == [signal.SIGTERM]
    engine = subprocess.Popen(["sleep", "30"])
    try:
        assert engine.poll() is None  # held: nothing was sent anywhere
        fwd.on_signal = told.append
        with capture_logs() as lines:
            fwd.engine(engine.pid)
        assert engine.wait(timeout=10) == -signal.SIGTERM
    finally:
        engine.kill()
        engine.wait()
    assert told == [signal.SIGTERM] and fwd.held == [] and not fwd.hold
    assert [x["event"] for x in lines] == ["signal.held", "signal.forwarded"]


def test_without_hold_or_after_the_engine_a_signal_with_no_engine_is_only_said() -> None:
    for fwd in (Forwarder(), Forwarder(hold=True)):
        if fwd.hold:
            fwd.engine(1 << 22)  # an engine ran (a pid that is not there) ...
            fwd.engine(None)  # ... and exited: from now on nothing is held
        with capture_logs() as lines:
            fwd(signal.SIGTERM, None)
        assert fwd.held == []
        assert [x.get("detail") for x in lines] == ["no engine running"]
