"""Unload before freeze (issue 38 item 4) in the kernel guest: a higher class's shed whose
victim is llama-server's router takes a whole idle model away first, before anything is
throttled or frozen.

The real router (scripts/engine-setup's llama-server) under `governor launch` in a background
slice ([qos] yield by default: unload first), two tiny models loaded by one request each
(tiny first, kv second: tiny is the least recently used) and idle; an interactive slice whose
rule always holds (`board available < 60G`, one firing: its cooldown outlasts the test) sheds.
Its first step on the router is "unload tiny": tiny's leaf empties, the router and kv's child
keep running (the same pids), kv answers, the router slice's memory.high and cgroup.freeze are
untouched. The shedder's stop gives the shed back (its journal's release).

Tiny models, -c 256, 4 tokens an answer: the TCG guest loads each in a few seconds.

Admission's shed (issue 46, the leftover "admission's shed never uses unload"): a router under
``evict = "memory"`` in a background slice, two idle models; an interactive launch with
``admit = "shed"`` whose peak lacks a few MiB on a board sized for it unloads the router's
least recently used idle model and lowers its budget (nothing stopped), `check` having named
that unload before; the router's evictor keeps its loads under that budget and each model it
keeps gets memory.high at its share (supervise/caphigh.py) until the admitted engine ends.
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
from helpers.server import KVGUEST, KVSERVER, SERVER, free_port, wait_ready

from governor.board.scan import scan
from governor.rundir.journal import Journal
from perf._helpers.engine_paths import TINY

from .test_router_guest import _ask, _pids

REPO = Path(__file__).resolve().parents[2]
ALL = ("memory", "cpu", "cpuset", "io", "pids")


def _launch(policy: Path, env: dict[str, str], *argv: str) -> subprocess.Popen[str]:
    with policy.with_suffix(".log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *argv],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def _state(run: Path, name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((run / name / "state.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data


def _shed(run: Path) -> list[dict[str, Any]]:
    return [e for e in Journal(run / "router").entries() if e["source"] == "shed"]


def _stop(gov: subprocess.Popen[str]) -> int:
    if gov.poll() is None:
        gov.send_signal(signal.SIGTERM)
    return gov.wait(timeout=120)


@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.engine(binary=SERVER, paths=(KVGUEST, TINY))
def test_a_shed_whose_victim_is_a_router_unloads_its_lru_idle_model_first(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name, target in (("tiny", TINY), ("kv", KVGUEST)):
        (models / f"{name}.gguf").symlink_to(target)
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    env["GOVERNOR_BOARD"] = str(tmp_path / "no-board.toml")
    slice_ = f'slice = "{scratch_slice.name}"\n'
    router_policy = tmp_path / "router.toml"
    router_policy.write_text(
        f'name = "router"\n{slice_}[memory]\nmax = "400M"\nswap_max = "0"\n'
        '[engine]\nkind = "llama.cpp"\n[qos]\nclass = "background"\n'
    )
    chat_policy = tmp_path / "chat.toml"
    chat_policy.write_text(
        f'name = "chat"\n{slice_}[qos]\nclass = "interactive"\n[[pressure]]\n'
        'when = "board available < 60G"\ndo = ["log", "shed"]\ncooldown = "600s"\n'
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    engine = [
        str(SERVER), "--models-dir", str(models), "-c", "256", "--cache-ram", "0", "-np", "1",
        "-t", "2", "--host", "127.0.0.1", "--port", str(port), "--chat-template", "chatml",
        "--no-webui",
    ]  # fmt: skip
    group = scratch_slice.path / "router"
    gov = _launch(router_policy, env, *engine)
    chat: subprocess.Popen[str] | None = None
    try:
        wait_ready(base, gov, timeout=300)
        assert _ask(base, "tiny")
        assert _ask(base, "kv")  # tiny is now the least recently used
        router = _pids(group / "engine")
        tiny, kv = _pids(group / "models" / "tiny"), _pids(group / "models" / "kv")
        assert len(router) == 1 and len(tiny) == 1 and len(kv) == 1, (router, tiny, kv)

        def published() -> bool:
            ms = (_state(run, "router").get("router") or {}).get("models") or {}
            return all((ms.get(m) or {}).get("last_request") for m in ("tiny", "kv"))

        cgroups.wait_for(published, 60, "the router's models published with a last request")
        last = _state(run, "router")["router"]["models"]
        assert last["tiny"]["last_request"] < last["kv"]["last_request"], last
        high = cgroups.read(group / "memory.high")
        t0 = time.monotonic()
        chat = _launch(chat_policy, env, "/bin/sleep", "600")
        cgroups.wait_for(lambda: _shed(run), 240, "the chat's shed on the router")
        shed_s = time.monotonic() - t0
        first = _shed(run)[0]
        seen = (  # what the shedder read, and what it logged, should the order be wrong
            first,
            _state(run, "router")["router"]["models"],
            [
                line[:300]
                for line in chat_policy.with_suffix(".log").read_text().splitlines()
                if "unload" in line or "router" in line
            ],
        )
        assert (first["step"], first["by"], first.get("model")) == ("unload", "chat", "tiny"), seen
        cgroups.wait_for(
            lambda: not _pids(group / "models" / "tiny"), 60, "tiny's child gone from its leaf"
        )
        # nothing else was taken: not throttled, not frozen, the router and kv untouched
        assert [e["step"] for e in _shed(run)] == ["unload"]
        assert cgroups.read(group / "memory.high") == high
        assert cgroups.read(group / "cgroup.freeze") == "0"
        assert _pids(group / "engine") == router
        assert _pids(group / "models" / "kv") == kv
        assert _ask(base, "kv")
        assert _pids(group / "models" / "kv") == kv  # the same child answered
        totals = _state(run, "chat")["shed_totals"]
        assert {"victim": "router", "step": "unload", "count": 1} in totals, totals
        assert _stop(chat) in (0, 143), chat_policy.with_suffix(".log").read_text()[-3000:]
        assert [e["step"] for e in _shed(run)] == ["unload", "release"]
        assert _ask(base, "tiny")  # it loads again at its next request
        results = {"shed_s": round(shed_s, 1), "unloaded": first["model"], "steps": 1}
        print("router unload guest:", json.dumps(results))
    finally:
        if chat is not None:
            _stop(chat)
        code = _stop(gov)
    assert code in (0, 143), router_policy.with_suffix(".log").read_text()[-3000:]


@pytest.mark.full  # the kernel tier's budget has no room left (docs/development.md); ~90 s
@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.engine(binary=SERVER, paths=(KVSERVER,))
def test_a_shed_admission_unloads_a_lower_class_routers_idle_model_and_lowers_its_budget(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a", "b"):
        (models / f"{name}.gguf").symlink_to(KVSERVER)
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    board = tmp_path / "board.toml"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run), "GOVERNOR_BOARD": str(board)}
    env["GOVERNOR_STATE_DIR"] = str(tmp_path / "state")
    slice_ = f'slice = "{scratch_slice.name}"\n'
    router_policy = tmp_path / "router.toml"
    router_policy.write_text(
        f'name = "router"\n{slice_}[memory]\nmax = "400M"\nswap_max = "0"\n'
        '[engine]\nkind = "llama.cpp"\nevict = "memory"\n[qos]\nclass = "background"\n'
    )
    chat_policy = tmp_path / "chat.toml"
    chat_policy.write_text(
        f'name = "chat"\n{slice_}[memory]\nmax = "64M"\n'
        '[qos]\nclass = "interactive"\nadmit = "shed"\nadmit_timeout = "60s"\n'
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    engine = [
        str(SERVER), "--models-dir", str(models), "--models-max", "3", "-c", "256",
        "--cache-ram", "0", "-np", "1", "-t", "2", "--host", "127.0.0.1", "--port", str(port),
        "--chat-template", "chatml", "--no-webui",
    ]  # fmt: skip
    group = scratch_slice.path / "router"
    gov = _launch(router_policy, env, *engine)
    chat: subprocess.Popen[str] | None = None
    try:
        wait_ready(base, gov, timeout=300)
        assert _ask(base, "a")
        assert _ask(base, "b")  # a is now the least recently used

        def published() -> bool:
            ms = (_state(run, "router").get("router") or {}).get("models") or {}
            return all((ms.get(m) or {}).get("last_request") for m in ("a", "b"))

        cgroups.wait_for(published, 60, "the router's models published with a last request")
        router, b_pid = _pids(group / "engine"), _pids(group / "models" / "b")
        # a board whose budget leaves the chat's 64 MiB peak 8 MiB short beside the router
        seen = scan(run=run, cgroup_root=Path("/sys/fs/cgroup"))
        claim = next(s for s in seen.slices if s.name == "router").peak_claim
        memtotal = int(cgroups.read(Path("/proc/meminfo")).split("MemTotal:")[1].split()[0]) << 10
        room = memtotal + seen.budget.zram_room - claim - (56 << 20)
        board.write_text(f'[board]\nreserve = "{room >> 20}MiB"\n')
        # `check --engine-argv` names the unload the start will make (the same decision, nothing
        # done; without an argv `check` compiles the policy alone: no admission)
        checked = subprocess.run(
            [sys.executable, "-m", "governor", "check", str(chat_policy),
             "--engine-argv", "/bin/sleep 600"], cwd=REPO, env=env,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert "; the shed would unload a from router router (frees " in checked.stderr, checked
        assert not _shed(run) and not (run / "router" / "cap.json").exists()
        high0 = {m: cgroups.read(group / "models" / m / "memory.high").strip() for m in "ab"}
        t0 = time.monotonic()
        chat = _launch(chat_policy, env, "/bin/sleep", "600")
        cgroups.wait_for(lambda: _state(run, "chat"), 120, "the chat admitted and published")
        admit_s = time.monotonic() - t0
        said = chat_policy.with_suffix(".log").read_text()
        line = next((x for x in said.splitlines() if "admission of chat unloaded" in x), said)
        assert line.startswith(
            "governor: admission of chat unloaded a from router router (a lower class),"
            " router's budget "
        ) and line.endswith(" until chat ends"), said
        cgroups.wait_for(lambda: not _pids(group / "models" / "a"), 60, "a's child gone")
        shed = _shed(run)
        assert [(e["step"], e["by"], e.get("model")) for e in shed] == [("unload", "chat", "a")]
        cap = json.loads((run / "router" / "cap.json").read_text())
        assert cap["by"] == "chat" and cap["models"] == ["a"] and cap["budget"] < claim, cap
        assert _pids(group / "engine") == router and _pids(group / "models" / "b") == b_pid
        # the kept model's leaf: memory.high at its share while the budget is lowered
        b_high = group / "models" / "b" / "memory.high"
        cgroups.wait_for(lambda: cgroups.read(b_high).strip() != high0["b"], 30, "b's share")
        assert int(cgroups.read(b_high)) >= int(cgroups.read(b_high.with_name("memory.current")))
        # the router's evictor keeps its loads under the lowered budget: a's load unloads b
        assert _ask(base, "a")
        cgroups.wait_for(lambda: not _pids(group / "models" / "b"), 60, "b unloaded for a")
        entries = Journal(run / "router").entries()
        assert ("b", "room for a") in [(e.get("model"), e.get("reason")) for e in entries]
        a_high = group / "models" / "a" / "memory.high"  # a's new leaf, loaded under the cap
        cgroups.wait_for(lambda: cgroups.read(a_high).strip() != high0["a"], 30, "a's share")
        assert _stop(chat) in (0, 143), said
        a_pid = _pids(group / "models" / "a")
        # given back with the budget
        cgroups.wait_for(lambda: cgroups.read(a_high).strip() == high0["a"], 30, "a's back")
        # the budget is back once the chat has ended: b loads beside a, nothing unloaded
        assert _ask(base, "b")
        assert _pids(group / "models" / "a") == a_pid and _pids(group / "models" / "b")
        kills = cgroups.read_kv(group / "memory.events")["oom_kill"]
        assert kills == 0
        results = {"admit_s": round(admit_s, 1), "budget_mib": cap["budget"] >> 20,
                   "before_mib": cap["before"] >> 20, "claim_mib": claim >> 20}  # fmt: skip
        print("router admission unload guest:", json.dumps(results))
    finally:
        if chat is not None:
            _stop(chat)
        code = _stop(gov)
    assert code in (0, 143), router_policy.with_suffix(".log").read_text()[-3000:]
