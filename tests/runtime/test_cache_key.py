"""The plan cache is keyed on what the compile reads (governor/plan/llama_args.py), through real
`governor launch` runs of a llama-server argv (a `llama-server` link to /bin/true; the policy
says ready at exec): a new prompt, port or seed is a hit; each input the compile reads
(-c, -np, --cache-ram, -ctk, the model file, LLAMA_ARG_* of the engine's environment, the
options) changed is a miss, and a LLAMA_ARG_CACHE_RAM above engine.max_cache_ram is refused
(65) where a cached plan once let it through. Needs what tests/runtime/conftest.py says.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import Governor, Run

POLICY = (
    '[engine]\nkind = "llama.cpp"\nmax_cache_ram = 1024\nready = "exec"\n\n'
    '[prefetch]\nmode = "none"\n'
)


def _server(governor: Governor) -> tuple[Path, list[str]]:
    exe = governor.workdir / "llama-server"
    exe.symlink_to("/bin/true")
    model = governor.workdir / "model.bin"
    model.write_bytes(b"not a gguf")
    argv = [str(exe), "-m", str(model), "-c", "512", "-np", "1", "--cache-ram", "512"]
    return governor.policy(POLICY), argv


def _stored(run: Run) -> bool:
    return run.code == 0 and run.has("plan_cache.stored") and not run.has("plan_cache.hit")


def _said(run: Run) -> str:
    """The one `governor: ...` line of a refused run (the JSON log lines aside)."""
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("governor: ")]
    assert len(lines) == 1, run.stderr
    return lines[0]


def _hit(run: Run) -> bool:
    return run.code == 0 and run.has("plan_cache.hit") and not run.has("plan_cache.stored")


def test_a_new_prompt_port_or_seed_is_a_hit(governor: Governor) -> None:
    policy, argv = _server(governor)
    assert _stored(governor.run(policy, [*argv, "-p", "hello", "--port", "8080"]))
    again = governor.run(policy, [*argv, "-p", "a new prompt", "--port", "9090", "-s", "7"])
    assert _hit(again), again.stderr


@pytest.mark.parametrize(
    "change",
    [["-c", "256"], ["-np", "2"], ["--cache-ram", "256"], ["-ctk", "q8_0"], ["-nr"]],
    ids=["ctx", "parallel", "cache-ram", "cache-type", "no-repack"],
)
def test_a_changed_caps_relevant_flag_is_a_miss(governor: Governor, change: list[str]) -> None:
    policy, argv = _server(governor)
    assert _stored(governor.run(policy, argv))
    assert _hit(governor.run(policy, argv))
    after = governor.run(policy, [*argv, *change])
    assert _stored(after), after.stderr


def test_a_changed_option_is_a_miss(governor: Governor) -> None:
    policy, argv = _server(governor)
    assert _stored(governor.run(policy, argv))
    after = governor.run(policy, argv, "--force")
    assert _stored(after), after.stderr


def test_a_changed_llama_arg_variable_is_a_miss_and_checked_against_the_cap(
    governor: Governor, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy, argv = _server(governor)
    argv = argv[: argv.index("--cache-ram")]  # the prompt cache's size from the environment
    monkeypatch.setenv("LLAMA_ARG_CACHE_RAM", "512")
    assert _stored(governor.run(policy, argv))
    assert _hit(governor.run(policy, argv))
    monkeypatch.setenv("LLAMA_ARG_CACHE_RAM", "256")
    assert _stored(governor.run(policy, argv))
    monkeypatch.setenv("LLAMA_ARG_CACHE_RAM", "4096")  # above max_cache_ram = 1024
    refused = governor.run(policy, argv)
    assert refused.code == 65, refused.stderr
    assert "--cache-ram 4096" in refused.stderr
    assert not governor.group.exists()


def test_a_changed_model_file_is_a_miss_and_a_relative_model_path_hits_again(
    governor: Governor,
) -> None:
    policy, argv = _server(governor)
    assert _stored(governor.run(policy, argv))
    model = Path(argv[2])
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert _stored(governor.run(policy, argv))
    relative = [argv[0], "-m", model.name, *argv[3:]]  # resolved against the cwd
    assert _stored(governor.run(policy, relative))
    assert _hit(governor.run(policy, relative))


def test_a_trailing_host_without_a_value_is_refused_though_a_plan_is_stored(
    governor: Governor,
) -> None:
    """Issue 35 item 17: the key dropped a trailing --host (no value) while the parser refuses
    it, so the stored plan let it through with exit 0; a fresh compile says 65."""
    policy, argv = _server(governor)
    assert _stored(governor.run(policy, argv))
    refused = governor.run(policy, [*argv, "--host"])
    assert refused.code == 65, refused.stderr
    assert not refused.has("plan_cache.hit")
    assert _said(refused).startswith("governor: engine option --host has no value")


def test_an_rkllm_count_that_is_an_option_word_is_refused_though_a_plan_is_stored(
    governor: Governor,
) -> None:
    """llm_demo reads its arguments by position: `-n 5` there is MAX_NEW_TOKENS "-n", which a
    compile refuses; the key once dropped it as llama.cpp's -n (a hit, exit 0)."""
    demo = governor.workdir / "llm_demo"
    demo.symlink_to("/bin/true")
    model = governor.workdir / "m.rkllm"
    model.write_bytes(b"rkllm weights")
    policy = governor.policy('[engine]\nkind = "rkllm"\n\n[prefetch]\nmode = "none"\n')
    assert _stored(governor.run(policy, [str(demo), str(model)]))
    refused = governor.run(policy, [str(demo), str(model), "-n", "5"])
    assert refused.code == 65, refused.stderr
    assert "rkllm MAX_NEW_TOKENS must be a positive integer" in refused.stderr


@pytest.mark.parametrize("port", ["99999", "0", "\u0668\u0660"])
def test_a_port_that_is_no_tcp_port_is_refused_before_anything_starts(
    governor: Governor, port: str
) -> None:
    """Issue 35 item 4: --port 99999 passed preflight, the engine started, the supervisor died
    on its /health URL (ValueError, exit 1) and killed the engine. The policy has no
    engine.ready: the server's /health on --port is what launch waits for."""
    exe = governor.workdir / "llama-server"
    exe.symlink_to("/bin/true")
    model = governor.workdir / "model.bin"
    model.write_bytes(b"not a gguf")
    policy = governor.policy(
        '[engine]\nkind = "llama.cpp"\nmax_cache_ram = 1024\n\n[prefetch]\nmode = "none"\n'
    )
    argv = [str(exe), "-m", str(model), "-c", "512", "--cache-ram", "512", "--port", port]
    refused = governor.run(policy, argv)
    assert refused.code == 65, refused.stderr
    assert _said(refused).endswith("(engine argv, --port)"), refused.stderr
    assert not refused.has("engine.started") and not governor.group.exists()
