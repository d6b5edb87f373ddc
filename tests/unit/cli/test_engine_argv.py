"""Engine argvs the engine itself would refuse are refused by the governor first, with one line
(issue 35 items 4, 11, 12): `check --engine-argv`, `estimate` and `init --engine-argv` and
`render k8s` answer `governor: ...` + `hint: ...` with their documented exit code, never a
traceback, and `render k8s` passes the argv to the kubelet byte for byte and mounts only what
it must. The launch side (refused before anything starts) is tests/runtime/test_cache_key.py.

Needs: the rk3588 host fixture and the example policies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.cli import run

from .test_app import RK3588, assert_one_line_error

SERVER_POLICY = """\
name = "srv"
[memory]
max = "1GiB"
[engine]
kind = "llama.cpp"
max_context_tokens = 4096
max_cache_ram = 1024
[prefetch]
mode = "none"
"""
RKLLM_POLICY = 'name = "npu"\n[engine]\nkind = "rkllm"\nmax_context_tokens = 2048\n'


@pytest.fixture
def server_policy(tmp_path: Path) -> Path:
    policy = tmp_path / "srv.toml"
    policy.write_text(SERVER_POLICY)
    (tmp_path / "m.gguf").write_bytes(b"x" * 64)
    return policy


SERVER = "/opt/llama/llama-server -m {model} -c 1024 --cache-ram 256"


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        ("--port 99999", "--port"),
        ("--port=65536", "--port"),
        ("--port -1", "--port"),
        ("--port 0", "--port"),
        ("--port \u0668\u0660", "--port"),  # Arabic-Indic digits: int() reads 80, stoi throws
        ("--host ,", "--host"),
        ("--host=", "--host"),
        ("-np 0", "-np/--parallel"),
        ("-np +0", "-np/--parallel"),
        ("-b 0", "-b/--batch-size"),
        ("-c 1_024", "-c/--ctx-size"),
        ("-c \u0661\u0662\u0668", "-c/--ctx-size"),
        ("-t " + "9" * 5000, "-t/--threads"),
        ("--ctx-checkpoints -2", "--ctx-checkpoints"),
    ],
)
def test_check_refuses_a_server_argv_the_engine_would_refuse(
    capsys: pytest.CaptureFixture[str], server_policy: Path, extra: str, option: str
) -> None:
    model = server_policy.parent / "m.gguf"
    argv = f"{SERVER.format(model=model)} {extra}"
    code, _, err = run(capsys, "--root", RK3588, "check", str(server_policy), "--engine-argv", argv)
    assert code == 65, err
    line = assert_one_line_error(err)
    assert line.endswith(f"(engine argv, {option})"), line
    assert len(line) < 200


@pytest.mark.parametrize(
    "counts",
    ["\u0661\u0662\u0668 2048", "\u00b2 2048", "128 " + "9" * 5000, "128 4294967296", "0 2048"],
    ids=["arabic-digits", "superscript", "5000-digits", "past-int32", "zero"],
)
def test_check_refuses_an_rkllm_count_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, counts: str
) -> None:
    policy = tmp_path / "npu.toml"
    policy.write_text(RKLLM_POLICY)
    model = tmp_path / "m.rkllm"
    model.write_bytes(b"w")
    code, _, err = run(
        capsys,
        "--root",
        RK3588,
        "check",
        str(policy),
        "--engine-argv",
        f"llm_demo {model} {counts}",
    )
    assert code == 65, err
    line = assert_one_line_error(err)
    assert "must be a positive integer" in line and len(line) < 200, line


def test_estimate_refuses_an_engine_argv_holding_a_double_dash(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "estimate", str(tmp_path / "m.gguf"), "--engine-argv", "-nr -- -c 9")
    assert code == 65, err
    assert assert_one_line_error(err).endswith(
        "holds '--': the engine's options would end there (--engine-argv)"
    )


def test_init_refuses_an_engine_argv_holding_a_double_dash(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    code, _, err = run(
        capsys, "--root", RK3588, "init", "--model", str(model), "--engine-argv", "-nr -- -t 2"
    )
    assert code == 2, err
    assert assert_one_line_error(err).endswith("would end there (--engine-argv)")


# ---------------------------------------------------------------- render k8s


def _k8s(capsys: pytest.CaptureFixture[str], policy: Path, *engine: str) -> tuple[int, str, str]:
    return run(capsys, "--root", RK3588, "render", "k8s", str(policy), "--", *engine)


def test_render_k8s_refuses_a_port_out_of_range_without_a_traceback(
    capsys: pytest.CaptureFixture[str], server_policy: Path
) -> None:
    engine = ["/opt/llama/llama-server", "-m", "/models/m.gguf", "-c", "1024", "--port", "99999"]
    code, out, err = _k8s(capsys, server_policy, *engine)
    assert (code, out) == (65, "")
    assert assert_one_line_error(err).endswith("(engine argv, --port)")


def _host_paths(text: str) -> dict[str, str]:
    doc = yaml.safe_load(text)
    return {v["hostPath"]["path"]: v["hostPath"]["type"] for v in doc["spec"]["volumes"]}


def test_render_k8s_never_mounts_the_hosts_root_or_a_system_directory(
    capsys: pytest.CaptureFixture[str], server_policy: Path
) -> None:
    engine = ["/usr/bin/llama-server", "-m", "/q4.gguf", "-c", "1024", "--cache-ram", "256"]
    code, out, err = _k8s(capsys, server_policy, *engine)
    assert code == 0, err
    assert _host_paths(out) == {"/q4.gguf": "File", "/usr/bin/llama-server": "File"}
    # a model directory of its own is mounted whole, normalised
    engine = ["/opt/llama/llama-server", "-m", "/models/./sub//q4.gguf", "-c", "1024"]
    code, out, err = _k8s(capsys, server_policy, *engine, "--cache-ram", "256")
    assert code == 0, err
    assert _host_paths(out) == {"/models/sub": "Directory", "/opt/llama": "Directory"}


@pytest.mark.parametrize("model", ["/models/../../q4.gguf", "/models/..", "models/q4.gguf"])
def test_render_k8s_refuses_a_model_path_that_is_no_host_path(
    capsys: pytest.CaptureFixture[str], server_policy: Path, model: str
) -> None:
    engine = ["/opt/llama/llama-server", "-m", model, "-c", "1024", "--cache-ram", "256"]
    code, out, err = _k8s(capsys, server_policy, *engine)
    assert (code, out) == (65, "")
    assert assert_one_line_error(err).endswith("(engine argv, -m/--model)")


def test_render_k8s_escapes_dollar_for_the_kubelet(
    capsys: pytest.CaptureFixture[str], server_policy: Path
) -> None:
    """The kubelet expands $(VAR) in command, args and env values and reads $$ as $: every $
    is doubled, so the engine gets the argv as written."""
    server_policy.write_text(
        SERVER_POLICY + '[process]\nenv = { GREETING = "$(HOME) costs $$5" }\n'
    )
    argv = ["/opt/llama/llama-server", "-m", "/models/m.gguf", "-c", "1024", "--cache-ram", "256"]
    code, out, err = _k8s(capsys, server_policy, *argv, "--api-key", "$(SECRET)", "-p", "$$ $")
    assert code == 0, err
    c = yaml.safe_load(out)["spec"]["containers"][0]
    assert c["args"][-4:] == ["--api-key", "$$(SECRET)", "-p", "$$$$ $$"]
    assert {"name": "GREETING", "value": "$$(HOME) costs $$$$5"} in c["env"]


def test_render_quadlet_keeps_dollar_and_percent_literal_in_exec(
    capsys: pytest.CaptureFixture[str], server_policy: Path
) -> None:
    """Quadlet copies Exec= into the service's ExecStart=, where systemd expands $VAR and %
    specifiers (podman#25047): both are doubled, as in `governor install`."""
    argv = ["/opt/llama/llama-server", "-m", "/q4.gguf", "-c", "1024", "--cache-ram", "256"]
    code, out, err = run(
        capsys, "--root", RK3588, "render", "quadlet", str(server_policy), "--", *argv,
        "--api-key", "$SECRET", "-p", "100%",
    )  # fmt: skip
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Exec=")]
    assert line.endswith(' --api-key "$$SECRET" -p 100%%'), line
    assert "Volume=/q4.gguf:/q4.gguf:ro" in out.splitlines()  # the file, never the host's /
