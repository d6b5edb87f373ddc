"""Conversations that survive an unload (issue 46 item 3) in the kernel guest: the real router
(scripts/engine-setup's llama-server, --slot-save-path) under `governor launch` with
``evict = "memory"`` and a memory.max that holds one of two 64 MiB models. A conversation on
``a`` (turn 1), a request to ``b`` (a unloaded for it, a's slot saved first), then ``a`` loaded
ahead of its next turn (POST /models/load: b unloaded for it) and that turn timed (one token of
answer: its time to first token). Twice: first with a's saved file removed before the load (no
restore: the whole conversation processed again), then as the governor does it (restored).

The turns go through /v1/completions with a raw prompt (no chat template) of two-letter words,
one token each in the synthetic vocabulary (perf/_helpers/server.py prompt): a turn is the
whole conversation so far plus a few new words, and its token count is known before it is
sent. (Through /v1/chat/completions the chatml markers and an answer's text tokenize into
many byte tokens: three earlier runs overflowed -c 256 on the second turn.)

Asserted: the governor saved and restored a's slot (its journal), the restored turn found the
conversation in its slot (llama-server's ``timings.cache_n``) and processed only its new words
(``timings.prompt_n``), the unrestored one processed all of it; the times are printed, never
asserted (TCG). kvserver.gguf (64 MiB), -c 256, -np 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice
from helpers.server import KVSERVER, SERVER, free_port, prompt, wait_ready

from governor.rundir.journal import Journal

from .test_router_guest import _ask

REPO = Path(__file__).resolve().parents[2]
ALL = ("memory", "cpu", "cpuset", "io", "pids")
FIRST_WORDS = 40  # turn 1: 41 tokens with <s>; each next turn adds NEXT_WORDS (-c 256 holds it)
NEXT_WORDS = 6


def _post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            data: dict[str, Any] = json.loads(answer.read())
    except urllib.error.HTTPError as err:  # the server's reason, not only its status
        raise AssertionError(f"{path}: HTTP {err.code}: {err.read()[:500]!r}") from err
    return data


def _turn(base: str, text: str) -> tuple[float, dict[str, Any]]:
    """One turn, one token of answer: (seconds, llama-server's timings: prompt_n, cache_n)."""
    t0 = time.monotonic()
    data = _post(
        base, "/v1/completions",
        {"model": "a", "prompt": text, "max_tokens": 1, "ignore_eos": True},
    )  # fmt: skip
    took = time.monotonic() - t0
    return took, data["timings"]


def _slots(run: Path, since: int, key: str) -> list[dict[str, Any]]:
    """The slot entries of model a after the first ``since`` ones that have ``key``."""
    entries = [e for e in Journal(run / "router").entries() if e["source"] == "slots"]
    return [e for e in entries[since:] if e["model"] == "a" and key in e]


def _until(what: str, check: Any, timeout: float = 120.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:g}s: {what}")


@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.engine(binary=SERVER, paths=(KVSERVER,))
# only with --full: its first pass (2026-12-06, TCG, 4 vCPUs) took 518 s, more than the kernel
# tier's budget has room for. The model's prompt processing dominates, not the loads: turn 1
# 137 s (a's load and 41 tokens), the next turn 85.6 s unrestored (47 tokens processed),
# 19.1 s restored (6 tokens)
@pytest.mark.full
def test_an_idle_conversation_gets_its_kv_cache_back_after_its_model_was_evicted(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a", "b"):
        (models / f"{name}.gguf").symlink_to(KVSERVER)
    saves = tmp_path / "slots"
    saves.mkdir()
    policy = tmp_path / "router.toml"
    policy.write_text(
        f'name = "router"\nslice = "{scratch_slice.name}"\n[memory]\nmax = "200M"\n'
        'swap_max = "0"\n[engine]\nkind = "llama.cpp"\nevict = "memory"\n'
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    engine = [
        str(SERVER), "--models-dir", str(models), "--models-max", "2", "-c", "256",
        "--cache-ram", "0", "-np", "1", "-t", "2", "--host", "127.0.0.1", "--port", str(port),
        "--chat-template", "chatml", "--no-webui", "--slot-save-path", str(saves),
    ]  # fmt: skip
    run = tmp_path / "run"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    log = tmp_path / "governor.log"
    group = scratch_slice.path / "router"
    with log.open("w") as err:
        gov = subprocess.Popen(
            [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *engine],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip
        try:
            wait_ready(base, gov, timeout=300)
            text = prompt(0, FIRST_WORDS)
            took, timings = _turn(base, text)  # turn 1: a loads, all of it processed
            results: dict[str, Any] = {"turn1_s": round(took, 2), "turn1": timings["prompt_n"]}
            for turn, case in enumerate(("without_restore", "with_restore"), start=1):
                held = len(text.split()) + 1  # the conversation so far in tokens, with <s>
                text += " " + prompt(turn, NEXT_WORDS)
                before = len(
                    [e for e in Journal(run / "router").entries() if e["source"] == "slots"]
                )
                time.sleep(1.2)  # the activity is sampled every 0.5 s: b is the newer
                assert _ask(base, "b")  # a (idle, least recently used) unloaded for b
                saved = _until("a's slot saved", lambda n=before: _slots(run, n, "saved"))
                assert saved[0]["saved"] == [0]
                if case == "without_restore":
                    for f in saves.glob("governor-a-*"):
                        f.unlink()  # the restore finds nothing: the conversation is lost
                _post(base, "/models/load", {"model": "a"})  # a ahead of its next turn
                done = _until("a's restore tried", lambda n=before: _slots(run, n, "restored"))
                took, timings = _turn(base, text)
                results[case] = {
                    "ttft_s": round(took, 2), "prompt_n": timings["prompt_n"],
                    "cache_n": timings["cache_n"], "held": held,
                    "restored": done[0]["restored"],
                }  # fmt: skip
            print("router slots guest:", json.dumps(results))
            lost, kept = results["without_restore"], results["with_restore"]
            assert lost["restored"] == []
            assert kept["restored"] == [0]
            # unrestored: the whole conversation processed again; restored: it was in the slot
            # (at least the previous turn's prompt), only the new words processed
            assert lost["cache_n"] == 0
            assert lost["prompt_n"] == lost["held"] + NEXT_WORDS
            assert kept["cache_n"] >= kept["held"]
            assert kept["prompt_n"] <= NEXT_WORDS
            kills = cgroups.read_kv(group / "memory.events")["oom_kill"]
            assert kills == 0
            assert gov.poll() is None
        finally:
            if gov.poll() is None:
                gov.send_signal(signal.SIGTERM)
            code = gov.wait(timeout=120)
    assert code in (0, 143), log.read_text()[-3000:]
