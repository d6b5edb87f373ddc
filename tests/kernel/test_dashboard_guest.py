"""The Grafana dashboard's every query (examples/grafana/governor.json) returns series from live
launches on a real cgroup v2 kernel with every controller (issue 48 item 3), through the real
Prometheus scraping their `--metrics` endpoints.

What the host tier cannot give is driven here for real: llama-server's router (two tiny models,
one request each: the model leaves, governor_model_memory_bytes) under a background policy with
memory.high/max (the memory families) whose rule `unload`s its idle models
(governor_model_unloads_total{reason="pressure"}), and an interactive slice whose shed takes a
step on the router (governor_shed_total) and whose cpu.weight enables the cpu controller
(cpu.stat's throttled_usec). Both rules hold at once (`board available < 60G`).
The same queries on the host: tests/runtime/test_dashboard_live.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from helpers import cgroups, dashboard
from helpers.cgroups import ScratchSlice
from helpers.server import KVGUEST, SERVER, free_port, wait_ready

from perf._helpers.engine_paths import TINY

from .test_router_guest import _ask

REPO = Path(__file__).resolve().parents[2]
ALL = ("memory", "cpu", "cpuset", "io", "pids")
WAIT_S = 240  # generous: TCG; bounds a hung test only


def _launch(policy: Path, env: dict[str, str], port: int, *argv: str) -> subprocess.Popen[str]:
    with policy.with_suffix(".log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "governor", "launch", "--policy", str(policy),
             "--metrics", f"127.0.0.1:{port}", "--", *argv],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def _state(run: Path, name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((run / name / "state.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data


def _stop(gov: subprocess.Popen[str]) -> int:
    if gov.poll() is None:
        gov.send_signal(signal.SIGTERM)
    return gov.wait(timeout=120)


def _ask_again(base: str, model: str) -> str:
    """One request, asked again (at most twice) when the router answers 500: the rule under
    test unloads an idle model every 2 s from the start, and a model the router has just loaded
    for a request can read as idle before that request reaches its slot (CI run 2026-12-06:
    a 500 on the first request). What this test proves is the dashboard's queries; the race
    itself is the unload action's (issue 46 note)."""
    for _ in range(2):
        try:
            return _ask(base, model)
        except openai.InternalServerError as err:
            print(f"dashboard guest: {model} answered 500 ({err}), asked again")
    return _ask(base, model)


@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.engine(binary=SERVER, paths=(KVGUEST, TINY))
def test_every_dashboard_query_returns_series_from_a_router_and_a_shedding_slice(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name, target in (("tiny", TINY), ("kv", KVGUEST)):
        (models / f"{name}.gguf").symlink_to(target)
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    env.pop("GOVERNOR_METRICS", None)
    env["GOVERNOR_BOARD"] = str(tmp_path / "no-board.toml")
    slice_ = f'slice = "{scratch_slice.name}"\n'
    router_policy = tmp_path / "router.toml"
    router_policy.write_text(
        f'name = "router"\n{slice_}[memory]\nhigh = "350M"\nmax = "400M"\nswap_max = "0"\n'
        '[engine]\nkind = "llama.cpp"\n[qos]\nclass = "background"\n[[pressure]]\n'
        'when = "board available < 60G"\ndo = ["unload"]\ncooldown = "2s"\n'
    )
    chat_policy = tmp_path / "chat.toml"
    chat_policy.write_text(
        f'name = "chat"\n{slice_}[cpu]\nweight = 100\n[qos]\nclass = "interactive"\n'
        "[[pressure]]\n"
        'when = "board available < 60G"\ndo = ["log", "shed"]\ncooldown = "600s"\n'
    )
    port, router_metrics, chat_metrics = free_port(), free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    engine = [
        str(SERVER), "--models-dir", str(models), "-c", "256", "--cache-ram", "0", "-np", "1",
        "-t", "2", "--host", "127.0.0.1", "--port", str(port), "--chat-template", "chatml",
        "--no-webui",
    ]  # fmt: skip
    gov = _launch(router_policy, env, router_metrics, *engine)
    chat: subprocess.Popen[str] | None = None
    prom = None
    try:
        wait_ready(base, gov, timeout=300)
        assert _ask_again(base, "tiny")
        assert _ask_again(base, "kv")

        def unloaded() -> bool:
            return bool((_state(run, "router").get("router") or {}).get("unloads"))

        cgroups.wait_for(unloaded, WAIT_S, "the router's rule unloads an idle model")
        chat = _launch(chat_policy, env, chat_metrics, "/bin/sleep", "600")
        cgroups.wait_for(
            lambda: bool(_state(run, "chat").get("shed_totals")), WAIT_S, "the chat's shed"
        )
        prom = dashboard.Prometheus(
            [f"127.0.0.1:{router_metrics}", f"127.0.0.1:{chat_metrics}"], tmp_path, scrape_s=5
        )
        found = dashboard.queries()
        left = dashboard.empty_queries(prom, found, "(chat|router)", timeout=WAIT_S)
        assert left == {}, (left, prom.targets(), prom.log.read_text()[-2000:])
        assert prom.label_values("policy", "governor_engine_up") == ["chat", "router"]
        # the event-driven series are the events', not stand-ins
        unloads = prom.query('governor_model_unloads_total{policy="router"}')
        assert {s["metric"]["reason"] for s in unloads} == {"pressure"}, unloads
        sheds = prom.query('governor_shed_total{policy="chat"}')
        assert {s["metric"]["victim"] for s in sheds} == {"router"}, sheds
        rows = prom.query('governor_model_memory_bytes{policy="router"}')
        assert {s["metric"]["model"] for s in rows} == {"tiny", "kv"}, rows
        print("dashboard guest:", json.dumps({"queries": len(found), "sheds": sheds}))
    finally:
        if prom is not None:
            prom.stop()
        if chat is not None:
            _stop(chat)
        code = _stop(gov)
    assert code in (0, 143), router_policy.with_suffix(".log").read_text()[-3000:]
