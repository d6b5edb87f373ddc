"""Router model names from a peer, mapped to safe leaves on a real kernel (issue 43 items 9 and
10): llama-server's router with a model named like llama.cpp's own preset example
(``[org/tiny:Q8_0]``, a ``/`` in it) and one named like an interface file (``memory.max``, a
``memory.max.gguf`` in the models directory). Before, the first never got a leaf (its child ran
in the engine leaf with no max) and the second failed silently every 20 ms (mkdir EEXIST: the
group's ``models/memory.max`` is the kernel's file). Now each gets its own leaf
(``models/org%2Ftiny:Q8_0``, ``models/_memory.max``) with its [engine.models] max, both
requests are answered, the interface file is untouched and `status` names each model with its
leaf. A name the kernel refuses (a newline) is proved on the fake tree
(tests/fakefs/test_model_names.py): one launch, two requests keep this under 90 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cgroups
from helpers.cgroups import ScratchSlice
from helpers.server import SERVER, free_port, wait_ready

from governor.operate.status import collect, render
from perf._helpers.engine_paths import TINY

from .test_router_guest import _ask, _pids

REPO = Path(__file__).resolve().parents[2]
ALL = ("memory", "cpu", "cpuset", "io", "pids")
MIB = 1 << 20


@pytest.mark.kernel(controllers=ALL, root=True, psi=True)
@pytest.mark.engine(binary=SERVER, paths=(TINY,))
def test_models_named_with_a_slash_and_like_an_interface_file_get_their_own_leaves(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "memory.max.gguf").symlink_to(TINY)
    preset = tmp_path / "models.ini"
    preset.write_text(f"[org/tiny:Q8_0]\nmodel = {TINY}\n")
    policy = tmp_path / "router.toml"
    policy.write_text(
        f'name = "router"\nslice = "{scratch_slice.name}"\n[memory]\nmax = "400M"\n'
        'swap_max = "0"\n[engine]\nkind = "llama.cpp"\n'
        '[engine.models."org/tiny:Q8_0"]\nmax = "120M"\n'
        '[engine.models."memory.max"]\nmax = "110M"\n'
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    engine = [
        str(SERVER), "--models-dir", str(models), "--models-preset", str(preset),
        "-c", "256", "--cache-ram", "0", "-np", "1", "-t", "2", "--host", "127.0.0.1",
        "--port", str(port), "--chat-template", "chatml", "--no-webui",
    ]  # fmt: skip
    group = scratch_slice.path / "router"
    run = tmp_path / "run"
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(run)}
    log = tmp_path / "governor.log"
    t0 = time.monotonic()
    with log.open("w") as err:
        gov = subprocess.Popen(
            [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *engine],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip
        try:
            wait_ready(base, gov, timeout=300)
            ready_s = time.monotonic() - t0
            router = _pids(group / "engine")
            assert _ask(base, "org/tiny:Q8_0")
            assert _ask(base, "memory.max")
            requests_s = time.monotonic() - t0 - ready_s
            slash, iface = group / "models" / "org%2Ftiny:Q8_0", group / "models" / "_memory.max"
            said = [line[:300] for line in log.read_text().splitlines() if "model" in line]
            assert len(_pids(slash)) == 1, said
            assert len(_pids(iface)) == 1, said
            assert _pids(group / "engine") == router  # only the router left in its leaf
            assert int(cgroups.read(slash / "memory.max")) == 120 * MIB
            assert int(cgroups.read(iface / "memory.max")) == 110 * MIB
            # the kernel's own file of models/ is untouched: a file, no limit written
            assert (group / "models" / "memory.max").is_file()
            assert cgroups.read(group / "models" / "memory.max").strip() == "max"
            assert not any('"model.refused"' in line for line in said), said
            state = json.loads((run / "router" / "state.json").read_text())
            leaves = {m: v.get("leaf") for m, v in state["router"]["models"].items()}
            assert leaves == {"org/tiny:Q8_0": "org%2Ftiny:Q8_0", "memory.max": "_memory.max"}
            # `governor status router`'s collect and render, in this process (a second Python
            # under TCG costs seconds): the state the launch published, the kernel's leaves
            status = render(collect(run, "router"))
            assert "model    org/tiny:Q8_0  leaf org%2Ftiny:Q8_0  loaded" in status, status
            assert "model    memory.max  leaf _memory.max  loaded" in status, status
            assert gov.poll() is None
            timings = {"ready_s": round(ready_s, 1), "two_requests_s": round(requests_s, 1)}
            print("router names guest:", json.dumps(timings))
        finally:
            if gov.poll() is None:
                gov.send_signal(signal.SIGTERM)
            code = gov.wait(timeout=120)
    assert code in (0, 143), log.read_text()[-3000:]
    assert not group.exists(), "the group and its model leaves are removed at the end"
