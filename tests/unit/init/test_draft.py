"""`governor init` (governor/init/draft.py, governor/cli/compile.py): a policy sized from the GGUF
estimate and a board's facts, which `governor check --engine-argv` then accepts on that board.

Round trips write a tiny GGUF with tests/engine/make_gguf.py (the `gguf` package of the dev
extra) and probe the fixture trees in tests/fixtures/hosts/ through the global --root. The
1.1 GiB model's numbers use its header shape (test_estimate._qwen18b) in place of a file.
"""

from __future__ import annotations

import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import run

from governor.board.budget import reserve_for
from governor.engines import budget
from governor.engines.estimate import MIB
from governor.errors import EXIT_NOINPUT, EXIT_POLICY, EXIT_USAGE, PolicyError
from governor.init import draft as ip

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
GIB = 1 << 30


def one_line_error(err: str) -> str:
    lines = err.splitlines()
    assert "Traceback" not in err and len(lines) == 2, err
    assert lines[0].startswith("governor: ") and lines[1].startswith("hint: ")
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO / "tests" / "engine"))
    try:
        import make_gguf  # type: ignore[import-not-found,unused-ignore]
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("model") / "tiny.gguf"
    assert make_gguf.main(["--preset", "tiny", "-o", str(out)]) == 0
    return out


def _init(capsys: pytest.CaptureFixture[str], root: str, *argv: str) -> tuple[dict, str, str]:  # type: ignore[type-arg]
    code, out, err = run(capsys, "--root", root, "init", *argv)
    assert code == 0, err
    return tomllib.loads(out), out, err


def _engine_line(text: str) -> tuple[str, str]:
    """The `governor check POLICY [--allow-missing X] --engine-argv '...'` comment's parts."""
    line = next(x for x in text.splitlines() if x.startswith("#   governor check "))
    words = shlex.split(line[1:])
    allow = words[words.index("--allow-missing") + 1] if "--allow-missing" in words else ""
    return allow, words[words.index("--engine-argv") + 1]


# ------------------------------------------------------------------ round trips through check


@pytest.mark.parametrize(
    ("host", "board"),
    [
        ("rk3588", None),
        ("cgroup2-full", "2G"),
        ("cgroup2-full", "4G"),
        ("cgroup2-full", "8G"),
        ("cgroup2-full", "248M"),  # tight: the context is cut below n_ctx_train
        ("no-psi", None),
        ("hybrid-host", None),
    ],
)
def test_generated_policy_passes_check_with_its_engine_argv(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str, board: str | None
) -> None:
    root = str(HOSTS / host)
    extra = ("--board-memory", board) if board else ()
    out_file = tmp_path / "p.toml"
    code, out, err = run(
        capsys, "--root", root, "init", "--model", str(tiny), *extra, "-o", str(out_file)
    )
    assert code == 0, err
    assert out.startswith(f"wrote {out_file}: -c ")
    text = out_file.read_text()
    policy = tomllib.loads(text)
    allow, argv = _engine_line(text)
    check = ["--root", root, "check", str(out_file), "--engine-argv", argv]
    code, out, err = run(capsys, *check, *(("--allow-missing", allow) if allow else ()))
    assert code == 0, out + err
    # without the memory controller the limits are listed as NOT in force, nothing to fit
    assert ("memory.max: fits" in out) != bool(allow), out
    # the argv asks for exactly the context the policy allows, and one more block is refused
    ctx = policy["engine"]["max_context_tokens"]
    assert f"-c {ctx}" in argv
    bigger = argv.replace(f"-c {ctx}", f"-c {ctx + 256}")
    code, _, err = run(capsys, *check[:-1], bigger, *(("--allow-missing", allow) if allow else ()))
    assert code == EXIT_POLICY and "max_context_tokens" in err
    # where the board has the controllers, nothing needs --allow-missing
    assert bool(allow) == (host in ("no-psi", "hybrid-host"))


def test_big_little_board_gets_the_big_cores_and_one_thread_each(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy, text, _ = _init(capsys, str(HOSTS / "rk3588"), "--model", str(tiny))
    assert policy["cpu"]["cpus"] == "big"
    assert policy["engine"]["threads"] == 4  # cpu4-7, the A76 cluster
    assert "big cores 4-7, LITTLE 0-3" in text
    assert " -t 4" in _engine_line(text)[1]
    plain, _, _ = _init(capsys, str(HOSTS / "cgroup2-full"), "--model", str(tiny))
    assert "cpu" not in plain  # 4 alike CPUs: no pinning


def test_a_background_engine_goes_before_an_interactive_one_if_the_board_runs_out(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The kernel's OOM killer takes the highest RSS + oom_score_adj/1000 of the board: init
    wrote 500 for every class, so beside a background job the larger engine, the chat, went
    first (seen drafting the real-engine QoS bench). A background job now gets npu-batch's 800."""
    root = str(HOSTS / "cgroup2-full")
    adj = {
        cls: _init(capsys, root, "--model", str(tiny), "--class", cls)[0]["process"][
            "oom_score_adj"
        ]
        for cls in ("interactive", "standard", "background")
    }
    assert adj["background"] > adj["standard"] >= adj["interactive"] > 0, adj


def test_memory_values_follow_the_estimate_and_the_board(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(HOSTS / "cgroup2-full")
    for board in (248 * MIB, 2 * GIB, 8 * GIB):
        policy, text, _ = _init(capsys, root, "--model", str(tiny), "--board-memory", str(board))
        mem = policy["memory"]
        size = {k: int(mem[k].removesuffix("MiB")) * MIB for k in ("min", "high", "max")}
        ctx = policy["engine"]["max_context_tokens"]
        args = ip._args((), tiny, ctx)
        est = budget.estimate_argv(args, root=Path(root), budget=None)
        assert size["min"] >= est.term("weights") > size["min"] - MIB
        assert size["max"] - MIB < est.total + ip.headroom_for(est.total) <= size["max"]
        assert est.total < size["high"] < size["max"]
        ceiling = (board - reserve_for(board)) >> 20 << 20  # whole MiB, as the values are
        assert size["max"] <= ceiling
        more = budget.estimate_argv(ip._args((), tiny, ctx + 256), root=Path(root), budget=None)
        assert ctx == 2048 or more.total + ip.headroom_for(more.total) > ceiling
        assert mem["swap_max"] == "0" and mem["oom_group"] is True
        assert policy["prefetch"]["mode"] == "populate"
        assert len(policy["pressure"]) == 4  # graded: some, full, longer full (freeze), kill
        assert f"{est.total / MIB:8.1f} MiB" in text  # the numbers behind the values


def test_reserve_scales_with_the_board() -> None:
    sizes = [reserve_for(b) for b in (1 * GIB, 2 * GIB, 4 * GIB, 8 * GIB, 64 * GIB)]
    assert sizes == sorted(sizes) and sizes[1] == 256 * MIB and sizes[-1] == GIB
    for ceiling in (100 * MIB, 1700 * MIB, 7 * GIB):
        fit = ip.fit_budget(ceiling)
        assert fit + ip.headroom_for(fit) <= ceiling < fit + 1 + ip.headroom_for(fit + 1)


def test_no_psi_board_gets_the_rules_commented_out(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy, text, _ = _init(capsys, str(HOSTS / "no-psi"), "--model", str(tiny))
    assert "pressure" not in policy
    assert "# [[pressure]]" in text and "no PSI" in text
    assert "memory controller(s) on cgroup2" in text  # the Pi's cgroup_disable=memory


def test_ctx_is_checked_against_the_largest_that_fits(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(HOSTS / "cgroup2-full")
    policy, _, _ = _init(capsys, root, "--model", str(tiny), "--board-memory", "248M")
    largest = policy["engine"]["max_context_tokens"]
    assert 256 <= largest < 2048
    asked, _, _ = _init(capsys, root, "--model", str(tiny), "--board-memory", "248M", "-c", "300")
    assert asked["engine"]["max_context_tokens"] == 300
    code, _, err = run(
        capsys, "--root", root, "init", "--model", str(tiny), "--board-memory", "248M",
        "--ctx", str(largest + 256),
    )  # fmt: skip
    assert code == EXIT_POLICY
    msg = one_line_error(err)
    assert f"-c {largest + 256} does not fit" in msg and f"largest -c that fits is {largest}" in msg


def test_a_model_that_does_not_fit_even_a_small_context_is_65_with_terms_and_fixes(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.toml"
    code, stdout, err = run(
        capsys, "--root", str(HOSTS / "rk3588"), "init", "--model", str(tiny),
        "--board-memory", "160M", "-o", str(out),
    )  # fmt: skip
    assert code == EXIT_POLICY and stdout == ""
    msg = one_line_error(err)
    assert "does not fit this board even at -c 256" in msg
    # RK3588's cores have dotprod (the tree's /proc/cpuinfo): ggml-cpu repacks the Q8_0 weights
    assert "llama.cpp needs ~41 MiB (weights 6 + repack 5 + " in msg
    assert "engine 15 + margin 13 MiB)" in msg  # no program: the largest binary measured
    assert "160 MiB - 138 MiB OS reserve" in msg
    assert "a smaller model" in err.splitlines()[1]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_big_model_on_a_2g_board_needs_no_repack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's story: on an x86 (AVX2) board of 2 GiB the 1.1 GiB model with its 651 MiB
    repack copy does not fit at any context; with -nr it does, with a context near 2048 (its
    logits counted up to 128 MiB of the 297 reserved: 1792 when all of them were)."""
    from ..engines.test_estimate import _qwen18b

    root = tmp_path / "board"
    import shutil

    shutil.copytree(HOSTS / "cgroup2-full", root, symlinks=True)
    (root / "proc" / "cpuinfo").write_text("flags\t\t: fpu sse avx avx2 fma\n")
    monkeypatch.setattr(budget, "read_gguf", lambda _path: _qwen18b())
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    model = tmp_path / "qwen18b.gguf"
    model.write_bytes(b"")
    argv = ("--root", str(root), "init", "--model", str(model), "--board-memory", "2G")
    code, _, err = run(capsys, *argv)
    assert code == EXIT_POLICY
    msg = one_line_error(err)
    assert "repack 652" in msg and "weights 1134" in msg
    assert err.splitlines()[1].startswith("hint: -nr (no weight repack: -651 MiB)")
    policy, text, _ = _init(capsys, str(root), *argv[3:], "--engine-argv", "-nr")
    assert 2048 <= policy["engine"]["max_context_tokens"] <= 2304, policy["engine"]
    assert policy["memory"]["min"] == "1134MiB"
    assert " -nr" in _engine_line(text)[1]


# ------------------------------------------------------------------ output and errors


def test_stdout_without_o_and_o_refuses_to_overwrite_without_force(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(HOSTS / "rk3588")
    out = tmp_path / "p.toml"
    out.write_text("# mine\n")
    code, stdout, err = run(capsys, "--root", root, "init", "--model", str(tiny), "-o", str(out))
    assert code == EXIT_USAGE and stdout == ""
    assert "exists" in one_line_error(err) and "--force" in err
    assert out.read_text() == "# mine\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.toml"]  # no temp file left
    code, _, err = run(
        capsys, "--root", root, "init", "--model", str(tiny), "-o", str(out), "--force"
    )
    assert code == 0, err
    assert tomllib.loads(out.read_text())["name"] == "tiny"
    assert f"governor check {out}" in out.read_text()  # the comment names the real file


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (("--model", "/nonexistent/m.gguf"), EXIT_NOINPUT, "model file not readable"),
        (("--name", "Bad Name"), EXIT_USAGE, "not a policy name"),
        (("--board-memory", "2X"), EXIT_USAGE, "not a size"),
        (("--board-memory", "2048"), EXIT_USAGE, "'2048' is 2048 bytes, less than a board's"),
        (("--engine-argv", "-c abc"), EXIT_USAGE, "not an integer"),
        (("--engine-argv", "-c 512", "--ctx", "1024"), EXIT_USAGE, "give the context once"),
        (("--engine-argv", "-m other.gguf"), EXIT_USAGE, "--engine-argv names -m"),
        (("-o", "/nonexistent/dir/p.toml"), EXIT_NOINPUT, "no such directory"),
    ],
)
def test_bad_input_is_one_line_with_a_hint(
    tiny: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], code: int, words: str
) -> None:
    model = () if "--model" in argv else ("--model", str(tiny))
    got, stdout, err = run(capsys, "--root", str(HOSTS / "rk3588"), "init", *model, *argv)
    assert got == code and stdout == ""
    assert words in err, err
    one_line_error(err)


def test_name_comes_from_the_model_file_and_engine_argv_keeps_its_program(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy, text, _ = _init(
        capsys, str(HOSTS / "rk3588"), "--model", str(tiny),
        "--engine-argv", f"/opt/llama/llama-server -m {tiny} -ub 128 -t 2", "--name", "chat",
    )  # fmt: skip
    assert policy["name"] == "chat"
    argv = _engine_line(text)[1]
    assert argv.startswith(f"/opt/llama/llama-server -m {tiny} -c ")
    assert argv.endswith("-ub 128 -t 2 --context-shift") and argv.count("-m ") == 1
    assert policy["engine"]["threads"] == 2
    named, _, _ = _init(capsys, str(HOSTS / "rk3588"), "--model", str(tiny))
    assert named["name"] == "tiny"


# ------------------------------------------------------------------ beside the board's tenants


def _claim(name: str, peak_mib: int, state: str = "running") -> Any:
    from governor.board.slice import QosClass, Slice

    return Slice(
        name=name, cgroup=f"governor.slice/{name}", qos=QosClass("background"), min=0,
        peak=peak_mib * MIB, peak_source="max", state=state,  # type: ignore[arg-type]
    )  # fmt: skip


def test_init_sizes_against_what_the_other_slices_leave_and_says_so(tiny: Path) -> None:
    """2 GiB board, reserve 256 MiB: alone the engine may have 1792 MiB; beside a batch job
    claiming 950 MiB (running) and an installed tts claiming 300 MiB, 542 MiB. Its own old
    claim (same name) does not count; --board-memory means an empty board of that size."""
    from governor.init.board import Tenants
    from governor.plan.host import probe

    host = replace_mem(probe_root(HOSTS / "cgroup2-full", probe), 2 * GIB)
    tenants = Tenants(claims=(_claim("batch", 950), _claim("tts", 300, "installed"),
                              _claim("tiny", 1500)))  # fmt: skip
    req = ip.Request(model=tiny, ctx=None)
    alone = ip.draft(req, host, root=HOSTS / "cgroup2-full")
    beside = ip.draft(req, host, root=HOSTS / "cgroup2-full", tenants=tenants)
    assert alone.sizing.ceiling == 1792 * MIB and alone.sizing.claimed == 0
    assert beside.sizing.ceiling == 542 * MIB and beside.sizing.claimed == 1250 * MIB
    assert beside.sizing.mem_max <= 542 * MIB
    assert "- 1250 MiB the other slices claim at peak = 542 MiB for the engine" in beside.text
    assert "batch 950 MiB (running); tts 300 MiB (installed)" in beside.text
    empty = ip.draft(
        ip.Request(model=tiny, board_memory=2 * GIB), host, root=HOSTS / "cgroup2-full",
        tenants=tenants,
    )  # fmt: skip
    assert empty.sizing.ceiling == 1792 * MIB and "other slices" not in empty.text
    # the board file's reserve replaces the default
    own = ip.draft(req, host, root=HOSTS / "cgroup2-full", tenants=Tenants(reserve=512 * MIB))
    assert own.sizing.ceiling == 1536 * MIB
    assert "OS reserve 512 MiB = 1536 MiB for the engine" in own.text


def test_a_server_draft_is_interactive_and_sheds_before_the_stall(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama-server answers a chat: init writes [qos] class = "interactive" and the
    `board available < headroom` shed rule (no PSI needed); a one-shot CLI is background,
    without the rule."""
    root = str(HOSTS / "rk3588")
    policy, _, _ = _init(
        capsys, root, "--model", str(tiny), "--engine-argv", "/opt/llama/llama-server -t 2"
    )
    assert policy["qos"]["class"] == "interactive"
    first = policy["pressure"][0]
    assert first["when"] == "board available < headroom" and first["do"] == ["log", "shed"]
    cli, _, _ = _init(capsys, root, "--model", str(tiny))
    assert cli["qos"]["class"] == "background"
    assert all("headroom" not in r["when"] for r in cli["pressure"])


def probe_root(root: Path, probe: Any) -> Any:
    return probe(root)


def replace_mem(host: Any, mem_total: int) -> Any:
    from governor.record import replace

    return replace(host, mem_total=mem_total)


def test_init_writes_an_explicit_admit_a_server_sheds_a_one_shot_run_waits(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(HOSTS / "cgroup2-full")
    policy, text, _ = _init(capsys, root, "--model", str(tiny), "--board-memory", "2G")
    assert policy["qos"] == {"class": "background", "admit": "wait"}
    assert 'admit = "wait"  # when the board cannot take it' in text
    server, text, _ = _init(
        capsys, root, "--model", str(tiny), "--board-memory", "2G",
        "--engine-argv", "llama-server -np 1 --port 8080",
    )  # fmt: skip
    assert server["qos"] == {"class": "interactive", "admit": "shed"}
    assert 'admit = "shed"  # when the board cannot take its peak' in text
    out_file = tmp_path / "server.toml"
    out_file.write_text(text)
    code, out, err = run(capsys, "--root", root, "check", str(out_file))
    assert code == 0, out + err


def test_init_blames_a_reserve_that_leaves_no_budget_not_the_model(tiny: Path) -> None:
    """Issue 43 item 8: [board] reserve >= MemTotal read as "the model does not fit"."""
    from governor.init.board import Tenants
    from governor.plan.host import probe

    host = replace_mem(probe_root(HOSTS / "cgroup2-full", probe), 2 * GIB)
    req = ip.Request(model=tiny, ctx=None)
    with pytest.raises(PolicyError) as err:
        ip.draft(req, host, root=HOSTS / "cgroup2-full", tenants=Tenants(reserve=2 * GIB))
    assert err.value.exit_code == 65
    assert str(err.value).startswith(
        "the reserve (2048 MiB) leaves no budget on this board (MemTotal 2048 MiB)"
        " ([board] reserve, "
    )
    assert "model" not in str(err.value)


def test_init_and_estimate_show_the_peak_earlier_runs_of_the_command_line_measured(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 45 item 3: a recorded peak above the formula's sizes memory.max from it; both
    `init` and `estimate` show it with its source."""
    from governor.state.peaks import peak_key, record_peak

    monkeypatch.setenv("GOVERNOR_STATE_DIR", str(tmp_path))
    root = str(HOSTS / "cgroup2-full")
    argv = ("--model", str(tiny), "--board-memory", str(2 * GIB))
    before, text, _ = _init(capsys, root, *argv)
    line = next(x for x in text.splitlines() if x.startswith("#   governor launch "))
    engine = shlex.split(line[1:])[shlex.split(line[1:]).index("--") + 1 :]
    est = budget.estimate_argv(ip._args((), tiny, 2048), root=Path(root), budget=None)
    key = peak_key(tiny, engine)
    assert key is not None
    for peak in (est.total + 200 * MIB, est.total + 300 * MIB):
        record_peak(tmp_path, key, peak, est.total)
    after, text, _ = _init(capsys, root, *argv)
    high = est.total + 300 * MIB
    assert int(after["memory"]["max"].removesuffix("MiB")) * MIB >= high + ip.headroom_for(high)
    assert after["memory"]["max"] != before["memory"]["max"]
    assert f"#   peak     {high / MIB:8.1f} MiB  (measured, 2 runs of this command line" in text
    code, out, err = run(capsys, "--root", root, "estimate", "--engine-argv", shlex.join(engine))
    assert code == 0, err
    peak_line = next(x for x in out.splitlines() if x.startswith("  peak "))
    assert peak_line.endswith(f" {high / MIB:.1f} MiB  (measured, 2 runs; the formula's total is"
                              f" {est.total / high:.2f}x it)")  # fmt: skip
