"""`governor board [--json] [--fits POLICY -- ENGINE...]` (issue 36) end to end on a tmp root:
a published state (the running claim), an install manifest (the installed claim), a fake
cgroup tree (memory.current, the ungoverned top-level cgroups) and /proc/meminfo.
Needs: a tmp directory (no kernel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import run

from governor.board.budget import plan_claim_dict
from governor.kernel import files
from governor.plan.model import QosSpec
from governor.record import replace
from governor.rundir.state import Publisher, applied
from governor.state.peaks import peak_key, record_peak
from governor.state.store import state_dir

from .plans import MEMORY_MAX, MEMORY_MIN, make_plan

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A 2 GiB board: npu-chat applied (memory.min 1.1 GiB, max 1.8 GiB, 600 MiB used), tts
    installed (stopped), system.slice 300 MiB, user.slice 4 MiB (too small for a row)."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 2097152 kB\nMemAvailable: 900000 kB\n")
    cg = tmp_path / "cg"
    for group, used in (
        ("governor.slice/npu-chat", 600 * MIB), ("system.slice", 300 * MIB),
        ("user.slice", 4 * MIB),
    ):  # fmt: skip
        (cg / group).mkdir(parents=True)
        (cg / group / files.MEMORY_CURRENT).write_text(f"{used}\n")
    for d in (cg, cg / "governor.slice"):  # a cgroup2 mount to probe
        for f in ("cgroup.controllers", "cgroup.subtree_control"):
            (d / f).write_text("cpuset cpu io memory pids\n")
    chat = replace(make_plan(), cgroup_root=str(cg), qos=QosSpec(qos_class="interactive"))
    run_dir = tmp_path / "run"
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run_dir))
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    Publisher(run_dir, chat.policy).publish(
        applied(chat, policy_path=None, created=[], started_at=1.0)
    )
    tts = replace(chat, policy="tts", group="governor.slice/tts", writes=())
    claim = plan_claim_dict(tts)
    claim["writes"] = [{"cgroup": "governor.slice/tts", "file": "memory.max", "value": "314572800"}]
    (tmp_path / "etc/governor/installed").mkdir(parents=True)
    (tmp_path / "etc/governor/installed/tts.json").write_text(json.dumps({"claim": claim}))
    return tmp_path


def test_board_json_adds_up_the_running_and_installed_claims(
    board: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "--root", str(board), "--cgroup-root", str(board / "cg"), "board", "--json"
    )
    assert code == 0, err
    v = json.loads(out)
    budget = 2048 * MIB - 256 * MIB  # reserve: 128 MiB + 2 GiB / 16
    assert (v["memtotal"], v["reserve"], v["budget"]) == (2048 * MIB, 256 * MIB, budget)
    rows = {s["name"]: s for s in v["slices"]}
    assert rows["npu-chat"]["state"] == "running" and rows["npu-chat"]["class"] == "interactive"
    assert (rows["npu-chat"]["min"], rows["npu-chat"]["peak"]) == (MEMORY_MIN, MEMORY_MAX)
    assert rows["npu-chat"]["current"] == 600 * MIB
    assert rows["tts"]["state"] == "installed" and rows["tts"]["peak"] == 300 * MIB
    assert v["claimed"] == {"min": MEMORY_MIN, "peak": MEMORY_MAX + 300 * MIB}
    assert v["free"] == {
        "guarantees": budget - MEMORY_MIN,
        "peaks": budget - MEMORY_MAX - 300 * MIB,
    }
    assert [(u["cgroup"], u["current"]) for u in v["ungoverned"]] == [("system.slice", 300 * MIB)]
    code, text, _ = run(capsys, "--root", str(board), "--cgroup-root", str(board / "cg"), "board")
    assert code == 0 and text.startswith("board: MemTotal 2048 MiB, reserve 256 MiB, budget")
    assert "npu-chat" in text and "installed" in text and "system.slice" in text


def test_board_file_reserve_changes_the_budget(
    board: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (board / "board.toml").write_text('[board]\nreserve = "512MiB"\n')
    code, out, _ = run(
        capsys, "--root", str(board), "--cgroup-root", str(board / "cg"), "board", "--json"
    )
    assert code == 0 and json.loads(out)["budget"] == 1536 * MIB


def test_board_fits_answers_no_with_75_and_yes_with_0(
    board: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Fits are weighed on the fixture board's MemTotal (7941 MiB) beside the same claims."""
    host = REPO / "tests/fixtures/hosts/cgroup2-full"
    cg = str(board / "cg")
    big = tmp_path / "big.toml"
    big.write_text('name = "big"\n[memory]\nmin = "7000MiB"\nmax = "7200MiB"\n')
    code, out, err = run(
        capsys, "--root", str(host), "--cgroup-root", cg, "board", "--fits", str(big)
    )
    assert code == 75, err
    assert out.startswith("no: big lacks") and "npu-chat holds 1126 MiB" in out
    small = tmp_path / "small.toml"
    small.write_text('name = "small"\n[memory]\nmin = "100MiB"\nmax = "500MiB"\n')
    code, out, err = run(
        capsys, "--root", str(host), "--cgroup-root", cg, "board", "--fits", str(small), "--json"
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["fits"] and got["peak"] == 500 * MIB and got["peak_source"] == "max"
    code, _, err = run(capsys, "--root", str(host), "--cgroup-root", cg, "board", "x")
    assert code == 2 and "needs --fits" in err


def test_board_fits_takes_the_engines_estimate_as_the_peak(
    board: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--fits POLICY -- ENGINE...`: the GGUF estimate of the engine's argv is the peak claim
    (as launch's admission counts it), not the policy's memory.max."""
    import sys

    pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO / "tests" / "engine"))
    try:
        import make_gguf  # type: ignore[import-not-found,unused-ignore]
    finally:
        sys.path.pop(0)
    model = tmp_path / "tiny.gguf"
    assert make_gguf.main(["--preset", "tiny", "-o", str(model)]) == 0
    capsys.readouterr()  # make_gguf's own lines
    host = REPO / "tests/fixtures/hosts/cgroup2-full"
    policy = tmp_path / "p.toml"
    policy.write_text('name = "p"\n[memory]\nmax = "1G"\n[engine]\nkind = "llama.cpp"\n')
    code, out, err = run(
        capsys, "--root", str(host), "--cgroup-root", str(board / "cg"), "board", "--json",
        "--fits", str(policy), "--", "llama-completion", "-m", str(model), "-c", "256",
    )  # fmt: skip
    assert code == 0, (out, err)
    got = json.loads(out)
    assert got["peak_source"] == "estimate" and 0 < got["peak"] < 1 << 30
    assert "peak_runs" not in got and "measured" not in got["line"]
    # issue 45 item 3: once a governed run of this model and argv measured its peak, that is
    # the claim (as admission's), with its source; in the JSON and in the line
    engine = ("llama-completion", "-m", str(model), "-c", "256")
    record_peak(state_dir(), str(peak_key(model, engine)), 7 * MIB, got["peak"])
    fits = ("board", "--fits", str(policy), "--", *engine)
    root = ("--root", str(host), "--cgroup-root", str(board / "cg"))
    code, out, err = run(capsys, *root, "board", "--json", *fits[1:])
    assert code == 0, (out, err)
    got = json.loads(out)
    assert (got["peak"], got["peak_source"], got["peak_runs"]) == (7 * MIB, "measured", 1)
    code, out, err = run(capsys, *root, *fits)
    assert code == 0 and "peak 7 MiB (measured, 1 run) of " in out, (out, err)


# ------------------------------------------------------------------ issue 43 item 8 and low items


def test_a_reserve_that_leaves_no_budget_is_refused_by_check_and_told_by_board(
    board: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    f = board / "board.toml"
    f.write_text('[board]\nreserve = "2GiB"\n')
    line = (
        "the reserve (2048 MiB) leaves no budget on this board (MemTotal 2048 MiB)"
        f" ([board] reserve, {f})"
    )
    code, _, err = run(capsys, "--root", str(board), "check", str(f))
    assert code == 65 and err.splitlines()[0] == f"governor: {line}", err
    assert err.splitlines()[1].startswith("hint: [board] reserve is the memory kept")
    cg = str(board / "cg")
    code, out, err = run(capsys, "--root", str(board), "--cgroup-root", cg, "board")
    assert code == 0, err
    assert out.splitlines()[3] == f"NO BUDGET: {line}: nothing can be admitted"
    # --fits weighs on a probed host (the fixture's MemTotal 7941 MiB): a policy with no
    # memory.min "fit" a budget of 0 ("min 0 MiB of 0 MiB left")
    host = REPO / "tests/fixtures/hosts/cgroup2-full"
    f.write_text('[board]\nreserve = "8GiB"\n')
    small = tmp_path / "small.toml"
    small.write_text('name = "small"\n[memory]\nmax = "100MiB"\n')
    code, out, err = run(capsys, "--root", str(host), "--cgroup-root", cg, "board", "--fits",
                         str(small))  # fmt: skip
    assert code == 75, (out, err)
    assert out == (
        "no: the board's budget is 0 (the reserve (8192 MiB) leaves no budget on this board"
        " (MemTotal 7941 MiB)): nothing can be admitted\n"
    )
    f.write_text('[board]\nreserve = "1GiB"\n')
    code, _, err = run(capsys, "--root", str(board), "check", str(f))
    assert code == 0, err


def test_board_reports_unknown_board_keys_as_check_does(
    board: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = board / "board.toml"
    f.write_text('[board]\nreserve = "512MiB"\nreserv = "1G"\n')
    code, _, err = run(capsys, "--root", str(board), "check", str(f))
    assert code == 65 and f"governor: unknown key ({f}, board.reserv)" in err
    code, out, err = run(
        capsys, "--root", str(board), "--cgroup-root", str(board / "cg"), "board", "--json"
    )
    v = json.loads(out)
    assert code == 0 and v["budget"] == 1536 * MIB  # the reserve is read all the same
    assert v["problems"] == [f"unknown key ({f}, board.reserv)"]


def test_status_under_root_weighs_the_roots_memtotal_as_board_does(
    board: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cg = str(board / "cg")
    code, out, err = run(capsys, "--root", str(board), "--cgroup-root", cg, "status", "--json")
    assert code == 0, err
    (item,) = [i for i in json.loads(out) if i["policy"] == "npu-chat"]
    code, out2, _ = run(capsys, "--root", str(board), "--cgroup-root", cg, "board", "--json")
    assert item["budget"]["memtotal"] == json.loads(out2)["memtotal"] == 2048 * MIB
