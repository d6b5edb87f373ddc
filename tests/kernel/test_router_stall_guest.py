"""A victim's router that trickles never stalls a higher class's monitor (issue 43 item 1) in the
kernel guest.

A background slice runs a stand-in "llama-server" router (tests/helpers/peers.py
fake_router_main: /health answers at once, every other path a byte per 0.5 s, for an hour)
under `governor launch`, which publishes its router url. An interactive slice whose rules
always hold (`board available < 60G`, the trick of test_router_unload_guest.py) sheds: its
first step on the victim, unload, asks the trickling router and gives up within unload.py's
UNLOAD_S; the same firing throttles the victim (memory.high set, its journal's step
"throttle"), and the interactive slice's other rule (log, every second) keeps firing after
it. The unbounded client held the shedder's monitor for as long as the router trickled.
No llama.cpp: the engine cache's tiny GGUF in --models-dir makes the launch a router.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice
from helpers.server import free_port

from governor.monitor.actions.unload import UNLOAD_S
from governor.rundir.journal import Journal
from perf._helpers.engine_paths import TINY

from .test_router_unload_guest import _launch, _state

REPO = Path(__file__).resolve().parents[2]
ALL = ("memory", "cpu", "cpuset", "io", "pids")


def _fired(run: Path, rule: int) -> int:
    totals = _state(run, "chat").get("action_totals") or []
    return sum(t["count"] for t in totals if t["rule"] == rule and t["action"] == "log")


def _stop(gov: subprocess.Popen[str]) -> int:
    if gov.poll() is None:
        gov.send_signal(signal.SIGTERM)
    return gov.wait(timeout=120)


def _wait(pred: Any, timeout: float, what: str, *logs: Path) -> Any:
    try:
        return cgroups.wait_for(pred, timeout, what)
    except AssertionError as err:
        tails = [f"--- {p.name}:\n{p.read_text()[-2500:]}" for p in logs if p.exists()]
        raise AssertionError("\n".join([str(err), *tails])) from None


@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.engine(paths=(TINY,))
def test_a_trickling_victim_router_is_throttled_in_time_and_the_shedders_rules_keep_firing(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny.gguf").symlink_to(TINY)
    server = tmp_path / "bin" / "llama-server"  # a router by its name and --models-dir
    server.parent.mkdir()
    server.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from helpers.peers import fake_router_main\nfake_router_main()\n"
    )
    server.chmod(0o755)
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run), "PYTHONPATH": str(REPO)}
    env["GOVERNOR_BOARD"] = str(tmp_path / "no-board.toml")
    slice_ = f'slice = "{scratch_slice.name}"\n'
    router_policy = tmp_path / "router.toml"
    router_policy.write_text(
        f'name = "router"\n{slice_}[memory]\nmax = "400M"\nswap_max = "0"\n'
        '[engine]\nkind = "llama.cpp"\n[qos]\nclass = "background"\n'
    )
    chat_policy = tmp_path / "chat.toml"
    chat_policy.write_text(
        f'name = "chat"\n{slice_}[qos]\nclass = "interactive"\n'
        '[[pressure]]\nwhen = "board available < 60G"\ndo = ["log", "shed"]\ncooldown = "600s"\n'
        '[[pressure]]\nwhen = "board available < 60G"\ndo = ["log"]\ncooldown = "1s"\n'
    )
    port = free_port()
    engine = [str(server), "--models-dir", str(models), "-c", "256", "--cache-ram", "0", "-np",
              "1", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    group = scratch_slice.path / "router"
    gov = _launch(router_policy, env, *engine)
    chat: subprocess.Popen[str] | None = None
    try:
        logs = (router_policy.with_suffix(".log"), chat_policy.with_suffix(".log"))

        def published() -> str | None:
            assert gov.poll() is None, logs[0].read_text()[-2500:]  # refused: say why at once
            url: str | None = (_state(run, "router").get("router") or {}).get("url")
            return url

        url = _wait(published, 300, "the router's url published", *logs)
        assert url == f"http://127.0.0.1:{port}"
        high = cgroups.read(group / "memory.high")
        t0 = time.monotonic()
        chat = _launch(chat_policy, env, "/bin/sleep", "600")

        def throttled() -> list[dict[str, Any]]:
            steps = [e for e in Journal(run / "router").entries() if e["source"] == "shed"]
            return [e for e in steps if e["step"] == "throttle"]

        (entry,) = _wait(throttled, 240, "the victim throttled", *logs)
        shed_s = time.monotonic() - t0
        assert entry["by"] == "chat"
        assert cgroups.read(group / "memory.high") != high  # set to what it uses
        fired = _fired(run, 1)
        _wait(lambda: _fired(run, 1) >= fired + 2, 60, "the chat's rule #1 again", *logs)
        log = chat_policy.with_suffix(".log").read_text()
        assert "shed.step_failed" in log and f"no whole answer within {UNLOAD_S:g}s" in log, log[
            -3000:
        ]
        steps = [e["step"] for e in Journal(run / "router").entries() if e["source"] == "shed"]
        assert steps == ["throttle"], steps  # the unload failed: no entry, no hold
        results = {"shed_s": round(shed_s, 1), "rule1_fired": _fired(run, 1)}
        print("router stall guest:", json.dumps(results))
    finally:
        if chat is not None:
            _stop(chat)
        code = _stop(gov)
    assert code in (0, 143), router_policy.with_suffix(".log").read_text()[-3000:]
